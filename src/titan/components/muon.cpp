#include "titan/components/muon.h"

#include "titan/common/check.h"

#include <algorithm>
#include <cmath>

namespace titan {

NewtonSchulz NewtonSchulz::of(const OptimizerSection& c) {
  NewtonSchulz ns;
  ns.a = c.muon_ns_a;
  ns.b = c.muon_ns_b;
  ns.c = c.muon_ns_c;
  ns.steps = c.muon_ns_steps;
  ns.eps = c.muon_eps;
  return ns;
}

at::Tensor newton_schulz(const at::Tensor& update, const NewtonSchulz& ns) {
  TITAN_CHECK(update.dim() == 2 || update.dim() == 3,
              "Newton-Schulz takes a matrix or a batch of matrices, not a ", update.dim(),
              "-d tensor");
  const bool batched = update.dim() == 3;
  const int64_t rows = update.size(-2);
  const int64_t cols = update.size(-1);
  at::Tensor x = update.to(at::kBFloat16, /*non_blocking=*/false, /*copy=*/true);
  if (rows > cols) x = x.transpose(-2, -1);
  if (batched) {
    // Each matrix by its own Frobenius norm (torch.optim.Muon's per matrix).
    at::Tensor norms = at::linalg_vector_norm(x, 2, {-2, -1}, /*keepdim=*/true);
    x.div_(norms.clamp_min(ns.eps));
  } else {
    x.div_(x.norm().clamp_min(ns.eps));
  }
  for (int64_t i = 0; i < ns.steps; ++i) {
    if (batched) {
      const at::Tensor gram = at::bmm(x, x.transpose(-2, -1));
      const at::Tensor poly = at::baddbmm(gram, gram, gram, ns.b, ns.c);
      x = at::baddbmm(x, poly, x, ns.a);
    } else {
      const at::Tensor gram = at::mm(x, x.t());
      const at::Tensor poly = at::addmm(gram, gram, gram, ns.b, ns.c);
      x = at::addmm(x, poly, x, ns.a);
    }
  }
  if (rows > cols) x = x.transpose(-2, -1);
  return x;
}

double muon_adjusted_lr(double lr, const std::string& rule, int64_t rows, int64_t cols) {
  const double r = static_cast<double>(rows);
  const double c = static_cast<double>(cols);
  if (rule == "original") return lr * std::sqrt(std::max(1.0, r / c));
  if (rule == "match_rms_adamw") return lr * 0.2 * std::sqrt(std::max(r, c));
  if (rule == "spectral_unclamped") return lr * std::sqrt(r / c);
  TITAN_CHECK(false, "unknown optimizer.muon_adjust_lr_fn '", rule,
              "' (original, match_rms_adamw, spectral_unclamped)");
  return lr;
}

bool muon_excluded(const std::string& fqn, const std::vector<std::string>& adamw_fqns) {
  const std::string dotted = "." + fqn + ".";
  return std::any_of(adamw_fqns.begin(), adamw_fqns.end(), [&](const std::string& entry) {
    return !entry.empty() && dotted.find("." + entry + ".") != std::string::npos;
  });
}

LocalOrthogonalizer::LocalOrthogonalizer(const std::vector<MuonMatrix>& matrices) {
  for (const MuonMatrix& m : matrices) {
    TITAN_CHECK(m.local_sizes == m.box.global_shape, "Muon: this rank holds a piece ",
                at::IntArrayRef(m.local_sizes), " of ", m.name, " ",
                at::IntArrayRef(m.box.global_shape),
                " and Newton-Schulz needs whole matrices; sharded runs exchange them "
                "(parallel/muon_exchange.h)");
  }
}

void LocalOrthogonalizer::run(const std::vector<at::Tensor>& updates, const NewtonSchulz& ns,
                              const std::function<void(size_t, const at::Tensor&)>& done) {
  for (size_t i = 0; i < updates.size(); ++i) done(i, newton_schulz(updates[i], ns));
}

}  // namespace titan
