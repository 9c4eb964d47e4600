// Helpers shared by the Hugging Face interop tests: small seeded models, temp folders, bitwise
// tensor comparison.
#pragma once

#include "../test_util.h"

#include "titan/models/llama3/args.h"
#include "titan/models/llama3/model.h"
#include "titan/models/registry.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

namespace titan::test {

// A tied-embedding GQA configuration of no registered flavor: 3 query heads per kv head,
// explicit ffn_dim, no rope scaling, another eps and theta.
inline nlohmann::json custom_tied_gqa_description() {
  return {{"name", "llama3"},
          {"flavor", "custom"},
          {"args",
           {{"dim", 96},
            {"n_layers", 2},
            {"n_heads", 6},
            {"n_kv_heads", 2},
            {"vocab_size", 130},
            {"ffn_dim", 200},
            {"norm_eps", 1e-6},
            {"rope_theta", 10000.0},
            {"use_rope_scaling", false},
            {"tie_embeddings", true}}}};
}

// The model of `description` with seeded random weights (norm weights too, so that a mix-up
// of any two tensors shows).
inline std::shared_ptr<Model> seeded_model(const nlohmann::json& description, uint64_t seed,
                                           int64_t max_seq_len = 64) {
  ModelBuildOptions options;
  options.max_seq_len = max_seq_len;
  auto model = spec_for_description(description).build_uninitialized(description, options);
  at::manual_seed(seed);
  at::NoGradGuard no_grad;
  for (auto& p : model->parameters()) {
    p.normal_(0.0, 0.5);
  }
  return model;
}

inline bool bit_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor x = a.contiguous();
  const at::Tensor y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

}  // namespace titan::test
