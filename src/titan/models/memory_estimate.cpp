// The training memory estimate (see memory_estimate.h). Activations come from the
// model's own ModelStats; they are affine in the batch, so they are evaluated at batch 1 and 2
// and extrapolated in double, which no batch size can overflow.
#include "titan/models/memory_estimate.h"

#include "titan/common/check.h"
#include "titan/common/format.h"
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

std::string gib_text(double bytes) {
  char buf[48];
  const double g = bytes / (1024.0 * 1024.0 * 1024.0);
  std::snprintf(buf, sizeof(buf), g < 1e5 ? "%.3f GiB" : "%.3g GiB", g);
  return buf;
}

std::string MemoryEstimate::breakdown() const {
  std::vector<std::string> terms;
  for (const Part& p : parts) {
    if (p.bytes > 0) terms.push_back(p.name + " " + gib_text(p.bytes));
  }
  return join(terms, " + ") + " = " + gib_text(total());
}

MemoryEstimate estimate_training_memory(const ModelSpec& spec, const std::string& flavor,
                                        int64_t batch, int64_t seq_len,
                                        at::ScalarType compute_dtype, int64_t param_shards,
                                        int64_t activation_shards) {
  const int64_t exact_len = std::min(seq_len, kExactSeqLen);
  const ModelStats one = spec.describe(flavor, 1, exact_len, compute_dtype);
  const ModelStats two = spec.describe(flavor, 2, exact_len, compute_dtype);
  const double per_sequence = static_cast<double>(two.activation_bytes - one.activation_bytes);
  const double fixed = static_cast<double>(one.activation_bytes) - per_sequence;
  const double length_scale = static_cast<double>(seq_len) / static_cast<double>(exact_len);
  const double activations = fixed + per_sequence * length_scale * static_cast<double>(batch);

  const double n = static_cast<double>(one.n_params);
  const double shards = static_cast<double>(std::max<int64_t>(1, param_shards));
  MemoryEstimate e;
  e.parts.push_back({"weights (fp32)", 4 * n / shards});
  e.parts.push_back({"gradients (fp32)", 4 * n / shards});
  e.parts.push_back({"optimizer (AdamW fp32)", 8 * n / shards});
  if (compute_dtype == at::kBFloat16) {
    // Tensor parallelism splits the copies over its ranks (activation_shards is its degree).
    // FSDP (param_shards beyond that) gathers one unit at a time: about two blocks' worth are
    // alive at once, the one running and the one prefetched.
    const double tp = static_cast<double>(std::max<int64_t>(1, activation_shards));
    double copies = 2 * n / tp;
    if (shards > tp) copies = std::min(copies, 2.0 * copies / static_cast<double>(std::max<int64_t>(1, one.n_layers)));
    e.parts.push_back({"bf16 weight copies", copies});
  }
  e.parts.push_back({"RoPE tables", rope_bytes(one, seq_len), /*scales_with_tokens=*/true});
  e.parts.push_back({"activations (estimate)",
                     activations / static_cast<double>(std::max<int64_t>(1, activation_shards)),
                     /*scales_with_tokens=*/true});
  return e;
}

void check_fits_in_memory(const MemoryEstimate& need, double available_bytes,
                          const std::string& what, const std::string& hint) {
  if (available_bytes <= 0 || need.total() <= kMemoryRefuseFactor * available_bytes) return;
  char factor[32];
  std::snprintf(factor, sizeof(factor), "%.3g", need.total() / available_bytes);
  throw ConfigError(what + " needs about " + gib_text(need.total()) + " of memory (" +
                    need.breakdown() + "), " + factor + "x the " + gib_text(available_bytes) +
                    " this machine has for it. HINT: " + hint +
                    " (`titan inspect` prints the estimate)");
}

}  // namespace titan
