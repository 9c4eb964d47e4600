// The training memory estimate (see memory_estimate.h). Activations come from the
// model's own ModelStats; they are affine in the batch, so they are evaluated at batch 1 and 2
// and extrapolated in double, which no batch size can overflow.
#include "titan/plan/memory_estimate.h"

#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/kernels/nf4.h"
#include "titan/models/common/rope.h"

#include <algorithm>
#include <cstdio>

namespace titan {
namespace {

// Sequences longer than this are extrapolated linearly from it (ModelStats is int64).
constexpr int64_t kExactSeqLen = int64_t{1} << 22;

double rope_bytes(const ModelStats& stats, int64_t seq_len) {
  return rope_table_bytes(stats.head_dim, seq_len);
}

// Activations kept for backward under the activation checkpointing of `options` (ModelStats'
// block parts). A checkpointed block keeps its input (or, per op, its costly ops' outputs) until
// backward reaches it, then holds the rest again while its backward runs. The blocks after it
// have been freed by then, so the recomputation raises the peak only when it is the last block.
double kept_activations(const ModelStats& s, const MemoryOptions& options) {
  const double all = static_cast<double>(s.activation_bytes);
  const double block = static_cast<double>(s.block_activation_bytes);
  if (options.ac_per_op) {
    const double dropped = block - static_cast<double>(s.block_op_kept_bytes);
    return all - static_cast<double>(s.n_layers) * dropped + dropped;
  }
  if (options.ac_every < 1) return all;
  const int64_t checkpointed = s.n_layers / options.ac_every;  // blocks every-1, 2 every-1, ...
  const double dropped = block - static_cast<double>(s.block_input_bytes);
  const bool last_is_checkpointed =
      checkpointed > 0 && checkpointed * options.ac_every == s.n_layers;
  return all - static_cast<double>(checkpointed) * dropped + (last_is_checkpointed ? dropped : 0.0);
}

// "activations (estimate)", "activations (estimate, full AC)", "... selective 2 AC)", "... op AC)".
std::string activations_label(const MemoryOptions& options) {
  if (options.ac_per_op) return "activations (estimate, selective op AC)";
  if (options.ac_every == 1) return "activations (estimate, full AC)";
  if (options.ac_every > 1) {
    return "activations (estimate, selective " + std::to_string(options.ac_every) + " AC)";
  }
  return "activations (estimate)";
}

}  // namespace

double MemoryEstimate::total() const {
  double sum = 0;
  for (const Part& p : parts) sum += p.bytes;
  return sum;
}

double MemoryEstimate::token_bytes() const {
  double sum = 0;
  for (const Part& p : parts) sum += p.scales_with_tokens ? p.bytes : 0.0;
  return sum;
}

std::string MemoryEstimate::breakdown() const {
  std::vector<std::string> terms;
  for (const Part& p : parts) {
    if (p.bytes > 0) terms.push_back(p.name + " " + gib_text(p.bytes));
  }
  return join(terms, " + ") + " = " + gib_text(total());
}

int64_t moe_layer_count(const nlohmann::json& args) {
  const int64_t n_layers = args.value("n_layers", int64_t{0});
  const int64_t step = std::max<int64_t>(1, args.value("interleave_moe_layer_step", int64_t{1}));
  int64_t n = 0;
  for (int64_t i = args.value("n_dense_layers", int64_t{0}); i < n_layers; ++i) {
    n += (i + 1) % step == 0;
  }
  return n;
}

int64_t routed_expert_params(const ModelSpec& spec, const std::string& flavor) {
  if (!spec.resolve_args) return 0;
  const nlohmann::json args = spec.resolve_args({{"name", spec.name}, {"flavor", flavor}});
  if (!args.contains("moe") || !args["moe"].is_object()) return 0;
  const nlohmann::json& moe = args["moe"];
  const int64_t moe_layers = moe_layer_count(args);
  // w1, w3 (dim -> hidden) and w2 (hidden -> dim) per expert.
  return moe_layers * moe.value("num_experts", int64_t{0}) * 3 * args.value("dim", int64_t{0}) *
         moe.value("hidden_dim", int64_t{0});
}

MemoryEstimate estimate_training_memory(const ModelSpec& spec, const std::string& flavor,
                                        int64_t batch, int64_t seq_len,
                                        at::ScalarType compute_dtype,
                                        const MemoryOptions& options) {
  const int64_t exact_len = std::min(seq_len, kExactSeqLen);
  const ModelStats one = spec.describe(flavor, 1, exact_len, compute_dtype);
  const ModelStats two = spec.describe(flavor, 2, exact_len, compute_dtype);
  const double kept_one = kept_activations(one, options);
  const double per_sequence = kept_activations(two, options) - kept_one;
  const double fixed = kept_one - per_sequence;
  const double length_scale = static_cast<double>(seq_len) / static_cast<double>(exact_len);
  double kept_batch = static_cast<double>(batch);
  if (options.pipeline_sequences_in_flight > 0) {
    kept_batch = std::min(kept_batch, options.pipeline_sequences_in_flight);
  }
  const double activations = fixed + per_sequence * length_scale * kept_batch;

  const double n = static_cast<double>(one.n_params);
  const double shards = static_cast<double>(std::max<int64_t>(1, options.param_shards));
  const int64_t activation_shards = std::max<int64_t>(1, options.activation_shards);
  // The routed experts, where they are split otherwise than the dense weights.
  const bool own_split = options.expert_shards > 0 || options.expert_param_shards > 0;
  const double experts = own_split ? static_cast<double>(routed_expert_params(spec, flavor)) : 0;
  const double expert_param_shards =
      options.expert_param_shards > 0 ? static_cast<double>(options.expert_param_shards) : shards;
  // QLoRA's base: whole on every rank, in NF4.
  const double nf4 = static_cast<double>(options.nf4_base_params);
  // Parameters this rank holds (fp32 master weights, or bf16 with bf16_state).
  const double held = (n - experts - nf4) / shards + experts / expert_param_shards;
  MemoryEstimate e;
  // AdamW keeps two moments per parameter, in the parameters' dtype.
  const double bytes = options.bf16_state ? 2 : 4;
  const std::string dtype = options.bf16_state ? "bf16" : "fp32";
  // With LoRA only the adapters are trained: gradients and AdamW moments for them alone; they
  // are parameters besides the model's own.
  const bool lora = options.trained_params >= 0;
  const double adapters = lora ? static_cast<double>(options.trained_params) / shards : 0;
  const double trained = lora ? adapters : held;
  const std::string of = lora ? ", LoRA adapters" : "";
  e.parts.push_back({"weights (" + dtype + ")", bytes * (held + adapters)});
  if (nf4 > 0) {
    e.parts.push_back({"frozen base (NF4, QLoRA)", nf4 * kernels::nf4_bytes_per_weight()});
  }
  e.parts.push_back({"gradients (" + dtype + of + ")", bytes * trained});
  const bool bf16_states = options.bf16_state || options.bf16_optimizer_state;
  const double state_bytes = bf16_states ? 2 : 4;
  const std::string state_dtype = bf16_states ? "bf16" : "fp32";
  if (options.muon_share > 0) {
    e.parts.push_back({"optimizer (Muon + AdamW " + state_dtype + of + ")",
                       (2 - options.muon_share) * state_bytes * trained});
  } else {
    e.parts.push_back({"optimizer (AdamW " + state_dtype + of + ")", 2 * state_bytes * trained});
  }
  if (compute_dtype == at::kBFloat16 && !options.bf16_state) {
    // Tensor parallelism splits the copies over its ranks (activation_shards is its degree).
    // FSDP (param_shards beyond that) gathers one unit at a time: about 1 + prefetch blocks'
    // worth are alive at once, the one running and those prefetched (all of them when it keeps
    // them).
    const double tp = static_cast<double>(activation_shards);
    const double expert_shards =
        options.expert_shards > 0 ? static_cast<double>(options.expert_shards) : tp;
    double copies = 2 * ((n - experts - nf4) / tp + experts / expert_shards);
    if (shards > tp && !options.fsdp_keeps_gathered)
      copies = std::min(copies, static_cast<double>(1 + options.fsdp_prefetch_units) * copies /
                                    static_cast<double>(std::max<int64_t>(1, one.n_layers)));
    e.parts.push_back({"bf16 weight copies", copies});
  }
  e.parts.push_back({"RoPE tables", rope_bytes(one, seq_len), /*scales_with_tokens=*/true});
  e.parts.push_back({activations_label(options),
                     activations / static_cast<double>(activation_shards) /
                         static_cast<double>(std::max<int64_t>(1, options.sequence_shards)),
                     /*scales_with_tokens=*/true});
  return e;
}

void check_fits_in_memory(const MemoryEstimate& need, double available_bytes,
                          const std::string& what, const std::string& hint,
                          const std::string& where) {
  if (available_bytes <= 0 || need.total() <= kMemoryRefuseFactor * available_bytes) return;
  char factor[32];
  std::snprintf(factor, sizeof(factor), "%.3g", need.total() / available_bytes);
  throw ConfigError(message(what, " needs about ", gib_text(need.total()), " of memory (",
                            need.breakdown(), "), ", factor, "x the ", gib_text(available_bytes),
                            " ", where, " has for it. HINT: ", hint,
                            " (`titan inspect` prints the estimate)"));
}

}  // namespace titan
