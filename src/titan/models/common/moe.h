// Mixture-of-experts feed-forward (TorchTitan's MoE layer, as Qwen3-MoE and DeepSeek-V3 use it):
//
//   scores   = score_func(router.gate(x))                  (tokens, experts), float32
//   experts  = top_k(scores + expert_bias) per token       (within the best groups when routing
//                                                            is group-limited; the bias steers the
//                                                            choice only, never the weights)
//   weights  = scores at the chosen experts                 (normalized to sum 1 when route_norm,
//                                                            then times route_scale)
//   out      = sum over chosen e of weight_e * expert_e(x)  + shared_experts(x)
//
// Tokens are reordered so that each expert's tokens are contiguous, run through the grouped
// experts (three (experts, out, in) weights: SwiGLU per expert), and added back to their
// positions. The experts run through an ExpertRunner: the default computes them here, expert
// parallelism swaps in one that sends each token to the rank holding its expert and back.
//
// Load balancing without an auxiliary loss (DeepSeek-V3, TorchTitan's load_balance_coeff): the
// layer counts the tokens each expert received (tokens_per_expert, a buffer, summed over the
// steps' micro-batches; while count_tokens is on, and not during activation checkpointing's
// recomputation); after each optimizer step update_expert_bias() moves expert_bias by
// coeff toward the experts below the mean load and away from those above, and resets the counts.
#pragma once

#include "titan/models/common/feed_forward.h"
#include "titan/models/common/linear.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace titan {

struct MoEArgs {
  int64_t num_experts = 8;
  int64_t top_k = 1;
  int64_t hidden_dim = 0;          // of each routed expert (moe_inter_dim)
  int64_t num_shared_experts = 0;  // one SwiGLU of hidden_dim * num_shared_experts, every token
  // Qwen3-Next: the shared experts' output times sigmoid(shared_gate(x)), a Linear dim -> 1 per
  // token (transformers' shared_expert_gate).
  bool shared_expert_gate = false;
  enum class Score { kSoftmax, kSigmoid } score_func = Score::kSoftmax;
  bool route_norm = false;  // normalize the top-k weights to sum 1 (Qwen3's norm_topk_prob)
  double route_scale = 1.0;
  // Multiply the routed tokens by their weights before the experts (TorchTitan's default) or the
  // experts' outputs after.
  bool score_before_experts = true;
  // Group-limited routing (DeepSeek-V3's n_group / topk_group): experts form num_expert_groups
  // equal groups; a token picks its top_k among the num_limited_groups groups whose scores
  // (sigmoid: the sum of the group's two best; softmax: its best) rank highest. 0: off.
  int64_t num_expert_groups = 0;
  int64_t num_limited_groups = 0;
  // Auxiliary-loss-free balancing step size; 0 turns the expert bias off.
  double load_balance_coeff = 1e-3;
  // Experts as grouped GEMMs (at::_grouped_mm, 16-bit compute) rather than one GEMM per expert.
  bool use_grouped_mm = true;
  // gpt-oss: a bias on the router's logits, biases on every expert's three projections, and the
  // clamped SwiGLU: with swiglu_limit > 0 an expert computes
  //   w2 ((clamp(u, -limit, limit) + 1) * g * sigmoid(swiglu_alpha * g)),  g = min(w1 x, limit),
  //   u = w3 x   (plus the biases), instead of w2 (silu(w1 x) * w3 x).
  bool router_bias = false;
  bool expert_biases = false;
  double swiglu_limit = 0.0;  // 0: plain SwiGLU
  double swiglu_alpha = 1.702;

  // Throws ConfigError (with the arithmetic) for impossible settings.
  void validate() const;
};

// "softmax" / "sigmoid"; throws ConfigError.
MoEArgs::Score parse_moe_score(const std::string& name);

// One (experts, out, in) weight of the grouped experts.
class ExpertWeight : public WeightLayer {
 public:
  ExpertWeight(int64_t experts, int64_t out_features, int64_t in_features);
  bool weight_is_matrix() const override { return true; }

  // Set by the LoRA converter (models/lora.h) on the experts it adapts: expert e's weight acts as
  // W[e] + lora_scaling * lora_b[e] lora_a[e], with lora_a (experts, r, in) and lora_b (experts,
  // out, r) ExpertWeights of their own, so expert parallelism slices them with the experts and
  // FSDP shards them like any weight. w1 and w3 read the same input and share one A, as PEFT's
  // adapter of the fused gate_up_proj does: w1 registers it ("w1.lora_a"), w3 holds a pointer.
  std::shared_ptr<ExpertWeight> lora_a, lora_b;
  // This weight is a LoRA adapter matrix.
  bool is_adapter = false;
};

// How the routed experts' GEMMs compute (model.converters "quantize.grouped_mm.float8" and
// "quantize.grouped_mm.mx", models/converters.h), each expert quantized on its own, as torchao's
// scaled grouped GEMMs for MoE training do:
//   kFloat8Rowwise  every GEMM operand cast to e4m3 with power-of-2 scales, one per row along the
//                   reduced dim: forward per token and per (expert, output feature); grad_input
//                   per token and per (expert, input feature); grad_weight per (expert, feature)
//                   over that expert's tokens (torchao's jagged per-group scales). The float8
//                   linear's rowwise recipe applied to each expert (float8.h).
//   kMxfp8          MXFP8 blocks of 32 along the reduced dim with the RCEIL scale rule (torchao's
//                   MXFP8 grouped recipe); each expert's tokens are zero-padded to a multiple of
//                   32, so that grad_weight's blocks along the tokens stay within one expert
//                   (torchao pads the groups the same way). mx.h's MX linear applied to each
//                   expert.
// The base weights only: LoRA adapters and biases stay in the compute dtype.
enum class ExpertGemm { kHighPrecision, kFloat8Rowwise, kMxfp8 };
struct ExpertQuantization {
  ExpertGemm gemm = ExpertGemm::kHighPrecision;
  // Float8: float32 products of the dequantized operands instead of at::_scaled_mm. MXFP8 is
  // emulated everywhere.
  bool emulate = true;
  // Float8: one scaled grouped GEMM per weight for all experts (float8_grouped.h; the same
  // numbers) instead of one GEMM per expert. Set on GPUs with ATen's float8 grouped kernel.
  bool grouped = false;
};
const char* expert_gemm_name(ExpertGemm gemm);

// One expert: x (tokens, in) @ w (out, in)^T in `q`'s GEMMs (forward and both gradients), the
// result in x's dtype.
at::Tensor quantized_expert_linear(const at::Tensor& x, const at::Tensor& w,
                                   const ExpertQuantization& q);
// The grouped form: x (tokens, in) grouped by expert, counts[e] rows for expert e, w (experts,
// out, in) -> (tokens, out); expert e's rows through quantized_expert_linear with w[e].
at::Tensor quantized_grouped_linear(const at::Tensor& x, const at::Tensor& w,
                                    const std::vector<int64_t>& counts,
                                    const ExpertQuantization& q);

// The routed experts: w1 and w3 (experts, hidden, dim), w2 (experts, dim, hidden); expert e is
// w2[e](silu(w1[e] x) * w3[e] x), each weight plus its LoRA adapter's product where it has one. A
// rank may hold a contiguous range of the experts (expert parallelism slices dim 0); nothing here
// depends on the count.
class GroupedExperts : public torch::nn::Module {
 public:
  GroupedExperts(int64_t experts, int64_t dim, int64_t hidden_dim, at::ScalarType compute_dtype,
                 bool use_grouped_mm, bool biases = false);

  // x (tokens, dim), grouped by expert: the first counts[0] rows go to this module's expert 0,
  // the next counts[1] to expert 1, ... counts (experts held) int64 on the CPU, summing to
  // tokens. Returns (tokens, dim) in the compute dtype.
  at::Tensor forward(const at::Tensor& x, const std::vector<int64_t>& counts);
  int64_t experts() const { return w1->weight.size(0); }

  // The two implementations forward picks between: one GEMM per expert with tokens, or one
  // grouped GEMM per weight (at::_grouped_mm; groups padded to 16 rows). forward uses the grouped
  // one when use_grouped_mm is set and the compute dtype is 16-bit (CUDA or CPU); quantized
  // experts (`quantization`) take the loop, or float8's grouped kernels where they are set.
  at::Tensor forward_loop(const at::Tensor& x, const std::vector<int64_t>& counts);
  at::Tensor forward_grouped(const at::Tensor& x, const std::vector<int64_t>& counts);
  // The grouped GEMMs with the counts as a (experts) int64 tensor on x's device: the padding and
  // the group offsets are computed there, with no host read.
  at::Tensor forward_grouped(const at::Tensor& x, const at::Tensor& counts);
  // Whether forward takes the grouped kernels (so the counts may stay on the device).
  bool groups_on_device() const;

  // Whether the LoRA converter adapted w1 and w3 (one shared A), or w2.
  bool gate_up_adapted() const { return w1->lora_b != nullptr; }
  bool down_adapted() const { return w2->lora_b != nullptr; }

  // The activation between the projections: silu(h1) * h3, or with swiglu_limit > 0 gpt-oss's
  // clamped SwiGLU (MoEArgs).
  at::Tensor activate(const at::Tensor& h1, const at::Tensor& h3) const;

  std::shared_ptr<ExpertWeight> w1, w2, w3;
  // With biases: b1 and b3 (experts, hidden), b2 (experts, dim), each expert's row added to its
  // projection's output. Expert parallelism slices them with the experts. Null otherwise.
  std::shared_ptr<Bias> b1, b2, b3;
  double swiglu_limit = 0.0;  // MoEArgs::swiglu_limit / swiglu_alpha
  double swiglu_alpha = 1.702;
  // Whether b2 is added here. Expert tensor parallelism clears it on every tp rank but the first:
  // w2's partial products are summed over tp after the experts, so the bias joins once (the other
  // ranks add it times zero, which gives their replicated b2 a zero gradient to sum).
  bool down_bias_here = true;
  at::ScalarType compute_dtype;
  bool use_grouped_mm;
  double lora_scaling = 0.0;  // of the adapters (see ExpertWeight)
  // Set by the grouped-GEMM converters: w1, w2 and w3's GEMMs in float8 or MXFP8.
  ExpertQuantization quantization;
};

// How the routed tokens reach their experts. `x` (routed tokens, dim) holds every token once per
// chosen expert, grouped by global expert id with counts[e] rows for expert e (all experts of
// the layer; `counts` (experts) int64 on x's device). Returns the experts' outputs in the same
// order. Runners read the counts back to the host only where they must (host_sync.h).
class ExpertRunner {
 public:
  virtual ~ExpertRunner() = default;
  virtual at::Tensor run(GroupedExperts& experts, const at::Tensor& x,
                         const at::Tensor& counts) = 0;
};

// `counts` read into host memory (one counted host read).
std::vector<int64_t> host_counts(const at::Tensor& counts);

// The default: this rank holds every expert. The grouped kernels take the counts on the device;
// the loop (float32, or use_grouped_mm off) reads them back once per call.
class LocalExperts final : public ExpertRunner {
 public:
  at::Tensor run(GroupedExperts& experts, const at::Tensor& x, const at::Tensor& counts) override;
};

// The router's choice for a batch of tokens.
struct Routing {
  at::Tensor experts;  // (tokens, top_k) int64: the chosen experts
  at::Tensor weights;  // (tokens, top_k) float32 (or wider): their weights (differentiable)
};

class MoE : public HookedModule {
 public:
  MoE(int64_t dim, const MoEArgs& args, at::ScalarType compute_dtype = at::kFloat);

  // x (bs, seqlen, dim) -> (bs, seqlen, dim) in the compute dtype.
  at::Tensor forward(const at::Tensor& x);
  // The router alone: x (tokens, dim).
  Routing route(const at::Tensor& x);

  // After an optimizer step: expert_bias += coeff * sign(mean load - load), centred (unless
  // expert_bias_frozen); then the counts restart. `loads` are the counts to use (tokens_per_expert
  // summed over the ranks that split the batch; undefined: this layer's own). No-op when
  // load_balance_coeff is 0.
  void update_expert_bias(const at::Tensor& loads = {});

  const MoEArgs& args() const { return args_; }

  std::shared_ptr<Linear> gate;     // router: (num_experts, dim)
  std::shared_ptr<Bias> gate_bias;  // (num_experts) added to the router's logits; null without
  std::shared_ptr<GroupedExperts> experts;
  std::shared_ptr<FeedForward> shared_experts;  // null without shared experts
  std::shared_ptr<Linear> shared_gate;          // (1, dim); null without shared_expert_gate
  std::shared_ptr<ExpertRunner> runner = std::make_shared<LocalExperts>();
  // debug.moe_force_load_balance: token t's j-th choice is expert (t * top_k + j) mod experts,
  // whatever the scores (for benchmarks and tests that need even loads).
  bool force_load_balance = false;
  // Whether forward adds its routing to tokens_per_expert (evaluation turns it off).
  bool count_tokens = true;
  // Set by the LoRA converter: the base model is frozen, its routing too (update_expert_bias
  // restarts the counts and leaves expert_bias as loaded), so that the adapters apply to the
  // base model as it was (PEFT's adapter on the Hugging Face base, which has no such state).
  bool expert_bias_frozen = false;
  // Buffers: (num_experts) float32; expert_bias is state to checkpoint, tokens_per_expert the
  // counts since the last update (float32 so it all-reduces on every backend).
  at::Tensor expert_bias;
  at::Tensor tokens_per_expert;

 private:
  MoEArgs args_;
  at::ScalarType compute_dtype_;
};

// "max/mean expert load" of the counts: 1 when even, num_experts when one expert takes all.
// A 0-d float64 tensor on the counts' device (computed there; nothing is read back).
at::Tensor load_imbalance(const at::Tensor& tokens_per_expert);

// The MoE layers of `model` by module name.
std::vector<std::pair<std::string, MoE*>> moe_layers(const torch::nn::Module& model);

// The buffers of `model` that are training state, by name: every MoE layer's expert_bias
// ("<layer>.expert_bias"; identical on the ranks that hold the layer). Checkpoints and Hugging
// Face folders carry them with the parameters.
std::vector<std::pair<std::string, at::Tensor>> state_buffers(const torch::nn::Module& model);

// Auxiliary-loss-free load balancing after an optimizer step, over the MoE layers of `models`
// (a rank's pipeline stages): every layer's token counts since the last call, in one tensor,
// go through `sum_over_ranks` (which sums them over the ranks that split the batch; a
// collective, so every rank calls this), then move each layer's expert bias toward balance
// (MoE::update_expert_bias) and restart. Returns each layer's name and its max/mean expert load
// as one float64 tensor on the device (read it when logging; nothing is read back here).
struct MoELoads {
  std::vector<std::string> layers;
  at::Tensor max_over_mean;  // (layers) float64; undefined without MoE layers
};
MoELoads balance_expert_loads(const std::vector<torch::nn::Module*>& models,
                              const std::function<at::Tensor(at::Tensor)>& sum_over_ranks);

// Evaluation forwards do not count tokens for load balancing: MoE::count_tokens is off in every
// MoE layer of `models` for the scope's lifetime.
class NoTokenCounting {
 public:
  explicit NoTokenCounting(const std::vector<torch::nn::Module*>& models);
  ~NoTokenCounting();
  NoTokenCounting(const NoTokenCounting&) = delete;
  NoTokenCounting& operator=(const NoTokenCounting&) = delete;

 private:
  std::vector<MoE*> layers_;
};

}  // namespace titan
