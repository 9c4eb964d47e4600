// Llama 3 model arguments, the named flavors (TorchTitan's dims plus small CPU flavors for our
// tests and benchmarks), and the analytic sizes of a configuration (no weights allocated).
#pragma once

#include "titan/models/common/rope.h"
#include "titan/models/model.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace titan::llama3 {

struct Llama3Args {
  int64_t dim = 4096;
  int64_t n_layers = 32;
  int64_t n_heads = 32;
  int64_t n_kv_heads = 0;  // 0: same as n_heads (plain multi-head attention)
  int64_t vocab_size = 128256;
  int64_t multiple_of = 256;        // the SwiGLU hidden size is rounded up to a multiple of this
  double ffn_dim_multiplier = 0.0;  // <= 0: none
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;  // Llama 3.1 scaling, applied when use_rope_scaling
  bool use_rope_scaling = true;
  bool depth_init = true;        // per-layer init std from the layer id (else from n_layers)
  bool tie_embeddings = false;   // output projection shares tok_embeddings.weight
  int64_t max_seq_len = 131072;  // RoPE table length; build() takes it from ModelBuildOptions

  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  int64_t head_dim() const { return dim / n_heads; }
  // TorchTitan's integer arithmetic: h = int(2 * 4 * dim / 3); h = int(ffn_dim_multiplier * h)
  // if set; then rounded up to a multiple of multiple_of.
  int64_t ffn_hidden_dim() const;
  // Checks that the heads divide evenly; throws ConfigError saying which.
  void validate() const;
};

// All flavors in registration order (small to large).
const std::vector<std::pair<std::string, Llama3Args>>& flavors();

// The arguments of `flavor`; throws ConfigError naming the nearest flavor if unknown.
Llama3Args args_for_flavor(const std::string& flavor);

// Analytic statistics for a micro-batch of (batch, seq_len) tokens with matmuls in
// `compute_dtype` (see args.cpp for the activation-memory formula).
ModelStats compute_stats(const Llama3Args& args, int64_t batch, int64_t seq_len,
                         at::ScalarType compute_dtype);

// "dim 4096, 32 layers, 32 heads, 8 kv heads, ffn 14336, vocab 128256"
std::string describe(const Llama3Args& args);

// The dtype of the residual stream between blocks when matmuls run in `compute_dtype`.
at::ScalarType residual_dtype(at::ScalarType compute_dtype);

}  // namespace titan::llama3
