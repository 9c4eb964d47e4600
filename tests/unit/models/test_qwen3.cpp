// Qwen3 on the Llama 3 decoder: the released sizes (total and active parameters as Qwen's model
// cards give them), the q/k norms and MoE blocks in the parameter list, descriptions that
// round-trip, and a tiny MoE model whose backward matches finite differences.
#include "titan/common/check.h"
#include "titan/models/llama3/model.h"
#include "titan/models/qwen3/spec.h"
#include "titan/models/registry.h"

#include "finite_difference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>

namespace titan {
namespace test_qwen3 {

TEST(Qwen3, ReleasedSizesMatchTheModelCards) {
  const ModelSpec& spec = get_model_spec("qwen3");
  struct Size {
    const char* flavor;
    double total, active, non_embedding;  // billions; 0: not checked
  };
  // Qwen3 model cards: 0.6B (0.44B non-embedding), 8B (6.95B), 32B (31.2B), 30B-A3B (30.5B, 3.3B
  // activated), 235B-A22B (235B, 22B activated).
  for (const Size& s :
       {Size{"0.6B", 0.6, 0, 0.44}, Size{"8B", 8.2, 0, 6.95}, Size{"32B", 32.8, 0, 31.2},
        Size{"30B-A3B", 30.5, 3.3, 0}, Size{"235B-A22B", 235, 22, 0}}) {
    const ModelStats st = spec.describe(s.flavor, 1, 4096, at::kBFloat16);
    const double total = static_cast<double>(st.n_params) / 1e9;
    EXPECT_NEAR(total, s.total, 0.02 * s.total) << s.flavor;
    if (s.active > 0) {
      EXPECT_NEAR(static_cast<double>(st.active_params()) / 1e9, s.active, 0.05 * s.active)
          << s.flavor;
    }
    if (s.non_embedding > 0) {
      // The cards count neither the embedding nor an untied output projection.
      const bool tied = std::string(s.flavor) == "0.6B";
      const int64_t embeddings = st.n_embedding_params * (tied ? 1 : 2);
      EXPECT_NEAR(static_cast<double>(st.n_params - embeddings) / 1e9, s.non_embedding,
                  0.02 * s.non_embedding)
          << s.flavor;
    }
  }
  EXPECT_EQ(spec.describe_flavor("30B-A3B"),
            "dim 2048, 48 layers, 32 heads, 4 kv heads of 128, qk norm, MoE 128 experts top-8 of "
            "ffn 768, vocab 151936");
}

TEST(Qwen3, BuildsQkNormsAndExperts) {
  ModelBuildOptions options;
  options.max_seq_len = 16;
  const ModelSpec& spec = get_model_spec("qwen3");
  const auto model = spec.build("tiny_moe", options);
  std::set<std::string> names;
  int64_t total = 0;
  for (const auto& item : model->named_parameters()) {
    names.insert(item.key());
    total += item.value().numel();
  }
  EXPECT_EQ(total, model->stats(1, 16).n_params);
  for (const char* name :
       {"layers.0.attention.q_norm.weight", "layers.0.attention.k_norm.weight",
        "layers.1.moe.gate.weight", "layers.1.moe.experts.w1.weight",
        "layers.1.moe.experts.w2.weight", "layers.1.moe.experts.w3.weight", "output.weight"}) {
    EXPECT_TRUE(names.count(name)) << name;
  }
  EXPECT_FALSE(names.count("layers.0.feed_forward.w1.weight"));
  // The expert bias is a buffer (state, not a parameter).
  bool bias = false;
  for (const auto& item : model->named_buffers()) bias |= item.key() == "layers.0.moe.expert_bias";
  EXPECT_TRUE(bias);
  // Descriptions round-trip through resolve_args, MoE and head_dim included.
  const nlohmann::json custom = {
      {"name", "qwen3"},
      {"flavor", "custom"},
      {"args",
       {{"dim", 64},
        {"n_layers", 1},
        {"n_heads", 4},
        {"head_dim", 16},
        {"qk_norm", true},
        {"moe", {{"num_experts", 2}, {"top_k", 1}, {"hidden_dim", 32}}}}}};
  const nlohmann::json resolved = spec.resolve_args(custom);
  EXPECT_EQ(resolved["head_dim"], 16);
  EXPECT_EQ(resolved["moe"]["num_experts"], 2);
  EXPECT_THROW(
      spec.resolve_args(
          {{"name", "qwen3"}, {"flavor", "custom"}, {"args", {{"moe", {{"num_expert", 2}}}}}}),
      ConfigError);
  const auto dense = spec.build("tiny", options);
  EXPECT_EQ(dense->stats(1, 16).active_params(), dense->stats(1, 16).n_params);
}

// The whole tiny MoE model in float64: autograd against central differences for a few entries of
// the router, an expert weight, a q norm and the embedding.
TEST(Qwen3, TinyMoeGradientsMatchFiniteDifferences) {
  ModelBuildOptions options;
  options.max_seq_len = 8;
  options.seed = 3;
  auto model = get_model_spec("qwen3").build("tiny_moe", options);
  model->to(at::kDouble);
  for (auto& moe : model->modules()) {
    if (auto* m = dynamic_cast<MoE*>(moe.get())) {
      ASSERT_EQ(m->args().top_k, 2);
    }
  }
  at::manual_seed(5);
  const at::Tensor tokens = at::randint(300, {2, 8}, at::kLong);
  const at::Tensor probe = at::randn({2, 8, 300}, at::kDouble);
  const auto loss = [&] { return (model->forward(tokens) * probe).sum(); };
  loss().backward();
  const auto params = model->named_parameters();
  for (const char* name : {"layers.0.moe.gate.weight", "layers.1.moe.experts.w2.weight",
                           "layers.0.attention.q_norm.weight", "tok_embeddings.weight"}) {
    const at::Tensor p = params[name];
    const at::Tensor g = p.grad().clone().view({-1});
    // The largest-gradient entries, where the difference quotient is far above rounding.
    const at::Tensor order = std::get<1>(g.abs().topk(3));
    for (int64_t i = 0; i < 3; ++i) {
      const int64_t j = order[i].item<int64_t>();
      const double want = test::central_difference(p, j, [&] { return loss().item<double>(); });
      EXPECT_NEAR(g[j].item<double>(), want, 1e-5 * std::max(1.0, std::abs(want)))
          << name << "[" << j << "]";
    }
  }
}

}  // namespace test_qwen3
}  // namespace titan
