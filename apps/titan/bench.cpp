// `titan bench`: times full training steps (forward, backward, clip, AdamW) of the configured
// model on random tokens, so the figure is the model's speed, not the data pipeline's. Prints one
// line with tokens/s, achieved TFLOP/s, MFU against a GEMM probe, and peak RSS. Run each variant
// in its own process (bench/run_bench.sh) so peak memory belongs to one variant.
#include "commands.h"

#include "titan/common/cpu.h"
#include "titan/common/format.h"
#include "titan/common/logging.h"
#include "titan/components/loss.h"
#include "titan/components/metrics.h"
#include "titan/components/optimizer.h"
#include "titan/config/config_manager.h"
#include "titan/models/registry.h"
#include "titan/trainer/trainer.h"

#include <chrono>
#include <cstdio>

namespace titan {

int run_bench(const std::vector<std::string>& args) {
  JobConfig config = parse_job_config(args);
  const auto& t = config.training;
  const std::string threads = configure_threads(t.num_threads);
  at::manual_seed(static_cast<uint64_t>(config.debug.seed < 0 ? 0 : config.debug.seed));
  const at::ScalarType dtype = dtype_from_name(t.mixed_precision_param);

  const ModelSpec& spec = get_model_spec(config.model.name);
  check_flavor(spec, config.model.flavor);
  ModelBuildOptions opts;
  opts.max_seq_len = t.seq_len;
  opts.compute_dtype = dtype;
  std::shared_ptr<Model> model = spec.build(config.model.flavor, opts);
  const ModelStats stats = model->stats(t.local_batch_size, t.seq_len);

  std::vector<NamedParam> named;
  std::vector<at::Tensor> params;
  for (const auto& item : model->named_parameters()) {
    named.push_back({item.key(), item.value()});
    params.push_back(item.value());
  }
  Optimizer optimizer(std::move(named), config.optimizer);

  auto step = [&]() {
    at::Tensor tokens = at::randint(stats.vocab_size, {t.local_batch_size, t.seq_len + 1}, at::kLong);
    at::Tensor inputs = tokens.narrow(1, 0, t.seq_len), labels = tokens.narrow(1, 1, t.seq_len);
    optimizer.zero_grad();
    at::Tensor loss = lm_cross_entropy_loss(model->forward(inputs), labels);
    loss.backward();
    clip_grad_norm(params, t.max_norm);
    optimizer.step(config.optimizer.lr);
    return loss.item<double>();
  };
  const int64_t warmup = 2;
  for (int64_t i = 0; i < warmup; ++i) step();
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < t.steps; ++i) step();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const double peak = config.metrics.peak_flops > 0 ? config.metrics.peak_flops : probe_peak_flops(dtype);
  const double tps = static_cast<double>(t.steps * t.local_batch_size * t.seq_len) / seconds;
  const double flops = stats.flops_per_token(t.seq_len) * tps;
  std::printf(
      "bench model=%s flavor=%s dtype=%s batch=%lld seq=%lld params=%lld steps=%lld "
      "tokens_per_s=%.1f tflops=%.4f peak_tflops=%.4f mfu_pct=%.2f peak_rss_gib=%.3f "
      "step_s=%.4f threads=\"%s\"\n",
      config.model.name.c_str(), config.model.flavor.c_str(), t.mixed_precision_param.c_str(),
      (long long)t.local_batch_size, (long long)t.seq_len, (long long)stats.n_params,
      (long long)t.steps, tps, flops / 1e12, peak / 1e12, 100.0 * flops / peak,
      static_cast<double>(peak_rss_bytes()) / (1024.0 * 1024.0 * 1024.0),
      seconds / static_cast<double>(t.steps), threads.c_str());
  return 0;
}

}  // namespace titan
