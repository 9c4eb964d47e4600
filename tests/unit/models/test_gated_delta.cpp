// The gated delta rule (Qwen3-Next's linear attention): the chunked form against the recurrent
// one in float64 (outputs, final states and every input's gradient; sequences not a multiple of
// the chunk, with and without an initial state, packed documents restarting the state), and
// both against transformers' reference
// functions on the inputs and outputs tests/e2e/test_gated_delta_reference.sh writes (the test
// is skipped without them).
#include "titan/checkpoint/safetensors.h"
#include "titan/models/common/gated_delta.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace titan {
namespace test_gated_delta {

struct Inputs {
  at::Tensor q, k, v, g, beta, state;
};

Inputs random_inputs(int64_t bs, int64_t len, int64_t heads, int64_t dk, int64_t dv) {
  Inputs in;
  in.q = at::randn({bs, len, heads, dk}, at::kDouble);
  // Unit keys, as the model's L2 norm makes them: the delta rule is stable for beta in (0, 1).
  in.k = at::randn({bs, len, heads, dk}, at::kDouble);
  in.k = in.k / in.k.norm(2, -1, true);
  in.v = at::randn({bs, len, heads, dv}, at::kDouble);
  in.g = -at::rand({bs, len, heads}, at::kDouble) * 0.5;  // decays in (0.6, 1]
  in.beta = at::sigmoid(at::randn({bs, len, heads}, at::kDouble));
  in.state = at::randn({bs, heads, dk, dv}, at::kDouble);
  return in;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

TEST(GatedDelta, ChunkedEqualsRecurrent) {
  at::manual_seed(3);
  const Inputs base = random_inputs(2, 23, 3, 8, 6);
  for (const int64_t chunk : {4, 8, 64}) {
    for (const bool with_state : {false, true}) {
      const std::string what = "chunk " + std::to_string(chunk) + (with_state ? " with state" : "");
      std::vector<std::vector<at::Tensor>> grads;
      std::vector<GatedDeltaResult> results;
      const at::Tensor probe = at::randn({2, 23, 3, 6}, at::kDouble);
      const at::Tensor state_probe = at::randn({2, 3, 8, 6}, at::kDouble);
      for (const bool chunked : {false, true}) {
        std::vector<at::Tensor> in = {base.q.clone(), base.k.clone(),    base.v.clone(),
                                      base.g.clone(), base.beta.clone(), base.state.clone()};
        for (auto& t : in) t.requires_grad_();
        const at::Tensor s0 = with_state ? in[5] : at::Tensor();
        const GatedDeltaResult r =
            chunked ? gated_delta_chunked(in[0], in[1], in[2], in[3], in[4], chunk, s0)
                    : gated_delta_recurrent(in[0], in[1], in[2], in[3], in[4], s0);
        ((r.out * probe).sum() + (r.state * state_probe).sum()).backward();
        std::vector<at::Tensor> g;
        for (size_t i = 0; i < (with_state ? 6u : 5u); ++i) g.push_back(in[i].grad());
        grads.push_back(g);
        results.push_back(r);
      }
      EXPECT_LT(max_diff(results[0].out, results[1].out), 1e-10) << what;
      EXPECT_LT(max_diff(results[0].state, results[1].state), 1e-10) << what;
      EXPECT_GT(results[0].out.abs().max().item<double>(), 0.1) << what;
      for (size_t i = 0; i < grads[0].size(); ++i) {
        EXPECT_LT(max_diff(grads[0][i], grads[1][i]), 1e-9) << what << " input " << i;
        EXPECT_GT(grads[0][i].abs().max().item<double>(), 1e-3) << what << " input " << i;
      }
    }
  }
}

// Packed documents: the state restarts at each document start. The chunked form equals the
// recurrent one (values, states, gradients) with documents inside, across and at chunk borders,
// and a document's output equals that of the document alone (from zero state; the first
// document continues the initial state).
TEST(GatedDelta, DocumentsRestartTheState) {
  at::manual_seed(9);
  const int64_t len = 23;
  const Inputs in = random_inputs(2, len, 2, 8, 6);
  // Row 0: documents [0, 5) [5, 8) [8, 17) [17, 23); row 1: one restart at 16 (a chunk border
  // for chunks of 8 and 4).
  at::Tensor docs = at::zeros({2, len}, at::kLong);
  for (int64_t t = 0; t < len; ++t) {
    docs[0][t] = (t >= 5) + (t >= 8) + (t >= 17);
    docs[1][t] = t >= 16;
  }
  const at::Tensor probe = at::randn({2, len, 2, 6}, at::kDouble);
  for (const int64_t chunk : {4, 8, 64}) {
    std::vector<std::vector<at::Tensor>> grads;
    std::vector<GatedDeltaResult> results;
    for (const bool chunked : {false, true}) {
      std::vector<at::Tensor> x = {in.q.clone(), in.k.clone(), in.v.clone(), in.g.clone(),
                                   in.beta.clone()};
      for (auto& t : x) t.requires_grad_();
      const GatedDeltaResult r =
          chunked ? gated_delta_chunked(x[0], x[1], x[2], x[3], x[4], chunk, in.state, docs)
                  : gated_delta_recurrent(x[0], x[1], x[2], x[3], x[4], in.state, docs);
      ((r.out * probe).sum() + r.state.sum()).backward();
      std::vector<at::Tensor> g;
      for (auto& t : x) g.push_back(t.grad());
      grads.push_back(g);
      results.push_back(r);
    }
    const std::string what = "chunk " + std::to_string(chunk);
    EXPECT_LT(max_diff(results[0].out, results[1].out), 1e-10) << what;
    EXPECT_LT(max_diff(results[0].state, results[1].state), 1e-10) << what;
    for (size_t i = 0; i < grads[0].size(); ++i) {
      EXPECT_LT(max_diff(grads[0][i], grads[1][i]), 1e-9) << what << " input " << i;
    }
  }
  // Row 0's third document [8, 17) alone, from zero state; row 1's first [0, 16) from the state.
  const auto alone = [&](int64_t row, int64_t t0, int64_t t1, const at::Tensor& s0) {
    const auto part = [&](const at::Tensor& t) {
      return t.narrow(0, row, 1).narrow(1, t0, t1 - t0);
    };
    return gated_delta_recurrent(part(in.q), part(in.k), part(in.v), part(in.g), part(in.beta), s0);
  };
  const GatedDeltaResult packed =
      gated_delta_chunked(in.q, in.k, in.v, in.g, in.beta, 8, in.state, docs);
  const GatedDeltaResult third = alone(0, 8, 17, {});
  EXPECT_LT(max_diff(packed.out.narrow(0, 0, 1).narrow(1, 8, 9), third.out), 1e-10);
  const GatedDeltaResult first = alone(1, 0, 16, in.state.narrow(0, 1, 1));
  EXPECT_LT(max_diff(packed.out.narrow(0, 1, 1).narrow(1, 0, 16), first.out), 1e-10);
  // The final state is the last document's alone.
  EXPECT_LT(max_diff(packed.state.narrow(0, 0, 1), alone(0, 17, len, {}).state), 1e-10);
}

// The recurrence written out for one head and two tokens.
TEST(GatedDelta, RecurrenceByHand) {
  at::manual_seed(5);
  const Inputs in = random_inputs(1, 2, 1, 4, 3);
  const at::Tensor s0 = in.state[0][0];  // (dk, dv)
  at::Tensor s = s0;
  std::vector<at::Tensor> outs;
  for (int64_t t = 0; t < 2; ++t) {
    const at::Tensor k = in.k[0][t][0], v = in.v[0][t][0], q = in.q[0][t][0] / 2.0;  // sqrt(4)
    s = s * std::exp(in.g[0][t][0].item<double>());
    s = s + at::outer(k, (v - at::matmul(k, s)) * in.beta[0][t][0]);
    outs.push_back(at::matmul(q, s));
  }
  const GatedDeltaResult r = gated_delta_recurrent(in.q, in.k, in.v, in.g, in.beta, in.state);
  EXPECT_LT(max_diff(r.out[0].select(1, 0), at::stack(outs)), 1e-12);
  EXPECT_LT(max_diff(r.state[0][0], s), 1e-12);
}

TEST(GatedDelta, MatchesTransformers) {
  const char* path = std::getenv("TITAN_GATED_DELTA_FIXTURE");
  if (path == nullptr) GTEST_SKIP() << "run by tests/e2e/test_gated_delta_reference.sh";
  const ckpt::SafetensorsReader file(path);
  const auto t = [&](const char* name) { return file.read(name); };
  const int64_t chunk = t("chunk_size").item<int64_t>();
  const GatedDeltaResult chunked =
      gated_delta_chunked(t("q"), t("k"), t("v"), t("g"), t("beta"), chunk, t("state"));
  const GatedDeltaResult recurrent =
      gated_delta_recurrent(t("q"), t("k"), t("v"), t("g"), t("beta"), t("state"));
  const double tol = 1e-5;
  EXPECT_LT(max_diff(chunked.out, t("out_chunk")), tol);
  EXPECT_LT(max_diff(chunked.state, t("state_chunk")), tol);
  EXPECT_LT(max_diff(recurrent.out, t("out_recurrent")), tol);
  EXPECT_LT(max_diff(recurrent.state, t("state_recurrent")), tol);
  std::printf(
      "gated delta vs transformers: chunked out %.3g state %.3g, recurrent out %.3g "
      "state %.3g\n",
      max_diff(chunked.out, t("out_chunk")), max_diff(chunked.state, t("state_chunk")),
      max_diff(recurrent.out, t("out_recurrent")), max_diff(recurrent.state, t("state_recurrent")));
}

}  // namespace test_gated_delta
}  // namespace titan
