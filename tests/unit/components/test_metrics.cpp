// Metrics: the JSON lines carry every documented key with the MFU arithmetic, and the GEMM probe
// reports a plausible positive FLOP/s.
#include "titan/common/cpu.h"
#include "titan/components/metrics.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace titan {
namespace metrics_test {

TEST(Metrics, JsonLinesHaveEveryKeyAndConsistentMfu) {
  auto dir = std::filesystem::temp_directory_path() / "titan_metrics_test";
  std::filesystem::remove_all(dir);
  MetricsSection cfg;
  cfg.log_freq = 2;
  cfg.disable_color_printing = true;
  const double flops_per_token = 1e6, peak = 1e12;
  {
    MetricsLogger logger(cfg, dir.string(), flops_per_token, peak, /*total_steps=*/4, true);
    for (int64_t step = 1; step <= 4; ++step) {
      auto m = logger.on_step(step, 1000, [&] { return LoggedValues{2.5, 0.7, 1e-3}; });
      EXPECT_EQ(m.has_value(), step != 3) << step;  // step 1, every log_freq, and the last
    }
    logger.log_validation(4, 2.0, 123, 0.1);
  }
  std::ifstream in(dir / "metrics.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    ++n;
    if (j.contains("validation_loss")) {
      EXPECT_DOUBLE_EQ(j["validation_loss"].get<double>(), 2.0);
      continue;
    }
    for (const char* key :
         {"step", "loss", "grad_norm", "lr", "tps", "tflops", "mfu", "memory_gib", "elapsed_s"}) {
      EXPECT_TRUE(j.contains(key)) << key;
    }
    EXPECT_DOUBLE_EQ(j["loss"].get<double>(), 2.5);
    const double tps = j["tps"].get<double>();
    EXPECT_GT(tps, 0);
    EXPECT_NEAR(j["mfu"].get<double>(), 100.0 * flops_per_token * tps / peak, 1e-9);
    EXPECT_GT(j["memory_gib"].get<double>(), 0.0);
  }
  EXPECT_EQ(n, 4);  // steps 1, 2, 4 and one validation line
}

TEST(Metrics, GemmProbeIsPositive) { EXPECT_GT(probe_peak_flops(at::kFloat, 0.05), 1e8); }

TEST(Metrics, GemmProbeMeasuresThePrecisionMatmulsRunIn) {
  // Without fast bf16 GEMMs the model multiplies bf16 in float32, and the probe follows: ATen's
  // generic bf16 loop does ~1 GFLOP/s on such a CPU, float32 tens.
  override_fast_bf16_matmul_for_testing(false);
  EXPECT_TRUE(widens_reduced_matmul(at::kBFloat16, at::kCPU));
  EXPECT_TRUE(widens_reduced_matmul(at::kHalf, at::kCPU));
  EXPECT_FALSE(widens_reduced_matmul(at::kFloat, at::kCPU));
  EXPECT_FALSE(widens_reduced_matmul(at::kBFloat16, at::Device(at::kCUDA, 0)));
  EXPECT_GT(probe_peak_flops(at::kBFloat16, 0.05), 5e9);
  override_fast_bf16_matmul_for_testing(true);
  EXPECT_FALSE(widens_reduced_matmul(at::kBFloat16, at::kCPU));
  override_fast_bf16_matmul_for_testing(std::nullopt);
}

TEST(Metrics, PeakRssIsBelowRam) {
  EXPECT_GT(peak_rss_bytes(), 0);
  EXPECT_LT(peak_rss_bytes(), total_ram_bytes());
}

TEST(PeakFlops, DatasheetFiguresByDeviceName) {
  // Names as the drivers report them.
  EXPECT_EQ(datasheet_peak_flops("NVIDIA H100 80GB HBM3"), 989e12);  // SXM
  EXPECT_EQ(datasheet_peak_flops("NVIDIA H100 PCIe"), 756e12);
  EXPECT_EQ(datasheet_peak_flops("NVIDIA H100 NVL"), 835e12);
  EXPECT_EQ(datasheet_peak_flops("NVIDIA H200"), 989e12);
  EXPECT_EQ(datasheet_peak_flops("NVIDIA H20"), 148e12);  // not H200's figure
  EXPECT_EQ(datasheet_peak_flops("NVIDIA GH200 480GB"), 989e12);
  EXPECT_EQ(datasheet_peak_flops("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_EQ(datasheet_peak_flops("NVIDIA A100 80GB PCIe"), 312e12);
  EXPECT_EQ(datasheet_peak_flops("NVIDIA B200"), 2.25e15);
  EXPECT_EQ(datasheet_peak_flops("NVIDIA GB200"), 2.5e15);  // not B200's figure
  EXPECT_EQ(datasheet_peak_flops("NVIDIA L40S"), 362e12);
  EXPECT_EQ(datasheet_peak_flops("AMD Instinct MI300X"), 1307e12);
  EXPECT_EQ(datasheet_peak_flops("AMD Instinct MI250X"), 383e12);
  // Unknown devices get no guess: the trainer measures and warns, or metrics.peak_flops is used.
  EXPECT_FALSE(datasheet_peak_flops("NVIDIA GeForce GTX 1080").has_value());
  EXPECT_FALSE(datasheet_peak_flops("").has_value());
  EXPECT_FALSE(datasheet_peak_flops("Intel(R) Xeon(R) Platinum 8480C").has_value());
}

}  // namespace metrics_test
}  // namespace titan
