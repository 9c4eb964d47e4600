// Dense layers with float32 master parameters whose matmuls may run in a lower precision.
// Under mixed precision the weight is cast to the compute dtype inside the forward, so autograd
// carries the gradient back to the float32 master. Layers read sizes from their weight tensors,
// never from cached constructor arguments, so a parallelism plan can shard them in place.
#pragma once

#include "titan/kernels/nf4.h"
#include "titan/models/common/deferred_grad.h"
#include "titan/models/common/float8.h"
#include "titan/models/common/fused_loss.h"
#include "titan/models/common/mx.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace titan {

// True for the 16-bit float types used as a compute dtype (bf16, fp16).
inline bool is_reduced_float(at::ScalarType dtype) {
  return dtype == at::kBFloat16 || dtype == at::kHalf;
}

// The dtype for numerically sensitive math (norms, softmax, RoPE) on an input of `dtype`:
// float32 for 16-bit inputs, otherwise the input's own dtype (float32, or float64 in tests).
inline at::ScalarType upcast_dtype(at::ScalarType dtype) {
  return is_reduced_float(dtype) ? at::kFloat : dtype;
}

// `x` in `compute_dtype` when that is a 16-bit type; otherwise `x` unchanged (full precision runs
// in the parameters' own dtype).
inline at::Tensor to_compute(const at::Tensor& x, at::ScalarType compute_dtype) {
  return is_reduced_float(compute_dtype) ? x.to(compute_dtype) : x;
}

// `weight` as a matmul multiplies it where a 16-bit `compute_dtype` runs in float32 on the
// rounded operands (widens_reduced_matmul): rounded to `compute_dtype` and held in float32, and its
// gradient rounded the same way, as weight.to(compute_dtype).to(kFloat) computes and
// differentiates. One pass each way for a float32 weight and bf16 on the CPU (the two casts take
// two, which costs a mixture of experts, whose weights outweigh its activations, a tenth of its
// step); the two casts otherwise.
at::Tensor widened_weight(const at::Tensor& weight, at::ScalarType compute_dtype);

// x @ weight^T with both operands in `compute_dtype` (see to_compute); the result stays in the
// compute dtype. x (..., in), weight (out, in) -> (..., out).
at::Tensor mixed_linear(const at::Tensor& x, const at::Tensor& weight,
                        at::ScalarType compute_dtype);

// A matmul whose output per-op activation checkpointing may keep (savable_ops.h), for matmuls
// that wire their own autograd function: `run(kept)` computes x @ weight^T of shape `out_sizes`,
// or, given a defined `kept` (the output the checkpointed forward kept, while recomputing),
// returns it with the function's backward attached.
at::Tensor savable_matmul(const at::Tensor& weight, at::IntArrayRef out_sizes,
                          const std::function<at::Tensor(const at::Tensor& kept)>& run);

// A module whose forward a parallelism may wrap without the module knowing (as PyTorch's forward
// hooks): forward calls hooked(x, body), which runs body(x) through the module's hooks, each
// handed the input and the rest of the chain. Tensor parallelism uses this to move activations
// between layouts around a layer (all-gather an input, reduce-scatter an output) or to replace a
// lookup; context parallelism will add its own. The hook added last runs outermost.
class HookedModule;
using ForwardBody = std::function<at::Tensor(const at::Tensor&)>;
class ForwardHook {
 public:
  virtual ~ForwardHook() = default;
  // Runs the module on `x` by calling `body` (the inner hooks, then the module itself).
  virtual at::Tensor run(HookedModule& module, const at::Tensor& x, const ForwardBody& body) = 0;
};

class HookedModule : public torch::nn::Module {
 public:
  // Adds `hook` outside the ones already installed.
  void add_forward_hook(std::shared_ptr<ForwardHook> hook);
  // Removes `hook` (no-op if absent).
  void remove_forward_hook(const ForwardHook* hook);
  bool has_forward_hooks() const { return !hooks_.empty(); }

 protected:
  at::Tensor hooked(const at::Tensor& x, const ForwardBody& body);

 private:
  std::vector<std::shared_ptr<ForwardHook>> hooks_;  // innermost first
};

// A layer whose one parameter, `weight`, is registered under that name and read through this
// member by forward. A parallelism may rebind the member (FSDP installs the all-gathered tensor
// there before the layer runs) without the layer knowing; see parameter_slots().
class WeightLayer : public HookedModule {
 public:
  at::Tensor weight;

  // Registers `w` as the parameter "weight" in place of the current one (a new tensor object:
  // e.g. storage for a parameter built on the meta device, which set_data cannot move to another
  // device). The `weight` member follows when it held the old parameter; a member a parallelism
  // rebound (or cleared) keeps what it holds.
  void replace_weight(const at::Tensor& w);
  // The registered parameter "weight" (which `weight` holds unless a parallelism rebound it).
  at::Tensor& registered_weight() { return parameters_["weight"]; }
  // Removes the parameter "weight" (a Linear whose frozen weight is held in NF4 instead).
  void unregister_weight();
  // Whether the weight is a matrix a layer multiplies by (a Linear's, a stack of experts'), the
  // kind Muon orthogonalizes, rather than an embedding table, a norm's scale or a bias.
  virtual bool weight_is_matrix() const { return false; }
};

// Where forward reads each parameter of a module tree: "<fqn>" -> the WeightLayer member.
struct ParamSlot {
  std::string name;
  at::Tensor* slot;
};
// The slots of every parameter of `root`, in named_parameters() order. Throws if a parameter is
// not the `weight` of a WeightLayer (a layer a parallelism could not rebind).
std::vector<ParamSlot> parameter_slots(torch::nn::Module& root);

// The FQNs of the parameters of `root` that are weight matrices (WeightLayer::weight_is_matrix).
std::set<std::string> matrix_parameters(torch::nn::Module& root);

// Gives every WeightLayer weight of `root` still on the meta device uninitialized storage on
// `device` (its current, possibly sliced shape), and moves the buffers (RoPE tables, built real
// on the CPU) there. Throws if another parameter is left on the meta device.
void materialize(torch::nn::Module& root, at::Device device);

// A parameter that its parent module reads in its own computation: a bias the parent adds after
// a Linear or an expert GEMM (so that a parallelism's hooks around the Linear leave it out: a
// row-wise split reduces the partial products before the parent adds the bias once), or
// gpt-oss's per-head attention sink logits. Parameter: weight, of the given sizes.
class Bias : public WeightLayer {
 public:
  explicit Bias(at::IntArrayRef sizes);
};

// A bias-free linear layer. Parameter: weight (out_features, in_features).
class Linear : public WeightLayer {
 public:
  Linear(int64_t in_features, int64_t out_features, at::ScalarType compute_dtype = at::kFloat);
  bool weight_is_matrix() const override { return true; }

  // x (..., in_features) -> (..., out_features) in the compute dtype.
  at::Tensor forward(const at::Tensor& x);
  // The layer as a model's head fused with the loss (fused_loss.h): the mean cross-entropy of
  // forward(x) against labels (x's leading dims) int64, a 0-d float32 tensor, through the
  // layer's hooks (tensor parallelism gathers x and sets vocab_shard).
  at::Tensor forward_loss(const at::Tensor& x, const at::Tensor& labels);
  // Whether forward_loss is running (for hooks that must not treat its result as logits).
  bool computing_loss() const { return loss_labels_ != nullptr; }
  // Whether forward(xc), xc in bf16, would multiply in float32 on the rounded operands with
  // nothing around the product: a bf16 layer on a CPU whose bf16 GEMMs are slow
  // (widens_reduced_matmul), an input of enough rows, and no hook, adapter, float8, MX, NF4 or
  // deferred weight gradient. Then widened_product(xc.to(float)).to(bf16) is forward(xc), and a
  // caller may keep the float32 product for the next op instead (feed_forward.cpp).
  bool widens_plainly(const at::Tensor& xc) const;
  // xw (..., in_features) float32 holding bf16 values -> the float32 product by the weight rounded
  // to bf16 (widened_weight), kept by per-op activation checkpointing like forward's.
  at::Tensor widened_product(const at::Tensor& xw);
  // "titan::Linear(in_features=256, out_features=768, float8=tensorwise)".
  void pretty_print(std::ostream& stream) const override;

  at::ScalarType compute_dtype;
  // Set by the float8 converter (models/converters.h): the matmuls run in float8 (float8.h) on
  // the operands in the compute dtype.
  std::optional<Float8LinearOptions> float8;
  // Set by the MX converter (models/converters.h): the matmuls run in MXFP8 (mx.h) with this scale
  // rule, emulated.
  std::optional<MxScaleRule> mx;
  // Set by FSDP's float8 all-gather (data_parallel.h) while the layer's weight is installed: the
  // weight as gathered in float8 with its tensorwise scale; the matmuls use it instead of casting
  // `weight`, which then carries only the gradient.
  std::optional<Float8Tensor> float8_weight;
  // Set by the pipeline runtime for the zero-bubble schedules (deferred_grad.h): while the
  // deferral collects, backward leaves the weight's gradient GEMM to the runtime's W step. Unset,
  // the layer computes as plain autograd ops.
  std::shared_ptr<WeightGradDeferral> deferral;
  // Set by tensor parallelism on a vocabulary-sharded head: forward_loss combines the shards.
  VocabShard vocab_shard;
  // Set by the LoRA converter (models/lora.h): a low-rank adapter whose output, times
  // lora_scaling, forward adds to the layer's: lora_b(lora_a(dropout(x))). Registered children
  // "lora_a" (r, in_features) and "lora_b" (out_features, r), so parallelisms shard, gather and
  // rebind them like any weight (tensor parallelism splits lora_b with a column-wise layer and
  // lora_a with a row-wise one). Dropout applies only while autograd records (training).
  std::shared_ptr<Linear> lora_a, lora_b;
  double lora_scaling = 0.0;
  double lora_dropout = 0.0;
  // This layer is a LoRA adapter matrix: the float8 converter leaves it in high precision.
  bool is_adapter = false;
  // Set by QLoRA's base quantization (quantize_frozen_nf4): the frozen weight held in NF4
  // (kernels/nf4.h) in place of the parameter "weight", which the layer no longer registers (no
  // optimizer, FSDP or checkpoint sees it). Every matmul, forward and backward, dequantizes it to
  // the compute dtype; backward keeps the NF4 tensors, not the dequantized weight.
  std::shared_ptr<const kernels::Nf4Weight> nf4_weight;

 private:
  // x @ weight^T alone (float8, deferred or plain), without the adapter.
  at::Tensor base_forward(const at::Tensor& in);
  // Whether base_forward is mixed_linear: no NF4, MX or float8 weight, and no weight gradient
  // deferred now.
  bool plain_product() const;

  const at::Tensor* loss_labels_ = nullptr;  // during forward_loss
};

// Inference: the weights of several Linear layers that read the same input (wq, wk, wv; w1, w3) as
// consecutive row blocks of one matrix, so that one product computes all their outputs (a decode
// step: one matrix-vector product instead of three). The layers' parameters become views of that
// matrix (same values, no extra memory) and keep working one by one.
class PackedLinear {
 public:
  // Packs `layers` and returns true when they qualify: weights defined on a real device, of one
  // dtype, device and input size, contiguous, and no layer with hooks, float8 or a gradient
  // deferral (a parallelism's or a converter's layers stay as they are). Under no-grad.
  bool pack(const std::vector<Linear*>& layers);
  // Whether the layers still compute with views of the packed matrix: false when never packed,
  // or when something rebound a weight (a cast, a move to another device) or hooked a layer since.
  bool intact() const;
  // x (..., in) -> each layer's output (..., out_i) in the compute dtype, views of one product.
  std::vector<at::Tensor> forward(const at::Tensor& x) const;

 private:
  at::Tensor weight_;  // (sum of out_i, in)
  std::vector<Linear*> layers_;
};

// x @ W^T for W held in NF4: W dequantized to the compute dtype (x's dtype when that is not a
// 16-bit type) for the product, and again for grad_x in backward, which keeps only the NF4
// tensors. No gradient for W (it is frozen); `weight` must live until backward has run (a layer's
// nf4_weight does). x (..., in) -> (..., out).
at::Tensor nf4_linear(const at::Tensor& x, const std::shared_ptr<const kernels::Nf4Weight>& weight,
                      at::ScalarType compute_dtype);

// What quantize_frozen_nf4 did.
struct Nf4Quantized {
  std::vector<std::string> layers;  // module names, in named_modules() order
  int64_t elements = 0;             // weight elements now held in NF4
  int64_t dense_bytes = 0;          // their bytes before (in the parameters' dtype)
  int64_t nf4_bytes = 0;            // and in NF4 (codes and scales)
};

// QLoRA's base: the weight of every Linear layer of `root` under a module named "layers" (the
// transformer blocks) that is frozen (requires_grad false) and not an adapter, quantized to NF4
// on the CPU (moved back to the weight's device) and unregistered (see Linear::nf4_weight). Layers
// with float8, hooks of a parallelism or an empty (meta) weight are refused with their name:
// quantize after the weights are loaded, before a parallelism wraps the model.
Nf4Quantized quantize_frozen_nf4(torch::nn::Module& root, const kernels::Nf4Options& options = {});

// The layers quantize_frozen_nf4 takes, by module name ("layers.0.attention.wq"): Linear layers
// under "layers." that are no adapter, with a registered weight that is frozen.
std::vector<std::string> frozen_block_linears(torch::nn::Module& root);

// The Linear layers of `root` that compute in float8, by the name of their weight parameter
// ("layers.0.attention.wq.weight"), in named_modules() order.
std::vector<std::pair<std::string, Linear*>> float8_linears(torch::nn::Module& root);

// A token embedding table. Parameter: weight (num_embeddings, dim).
class Embedding : public WeightLayer {
 public:
  Embedding(int64_t num_embeddings, int64_t dim);

  // tokens (...) int64 -> (..., dim) in the parameter dtype.
  at::Tensor forward(const at::Tensor& tokens);
};

}  // namespace titan
