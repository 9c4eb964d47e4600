// Metrics: one line per logged step and one JSON object per line of metrics.jsonl.
// Throughput covers the steps since the previous log (the first window includes warm-up).
#include "titan/components/metrics.h"

#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/common/device.h"
#include "titan/common/file_io.h"
#include "titan/common/format.h"
#include "titan/common/logging.h"

#include <ATen/core/grad_mode.h>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <sstream>

namespace titan {

int64_t peak_rss_bytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // ru_maxrss is KiB on Linux
}

int64_t total_ram_bytes() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) *
         static_cast<int64_t>(sysconf(_SC_PAGE_SIZE));
}

double probe_peak_flops(at::ScalarType dtype, double budget_s, const at::Device& device) {
  at::NoGradGuard no_grad;
  // Where the model's 16-bit matmuls run in float32, so does the probe (ATen's bf16 GEMM there
  // is a generic loop at ~0.1% of float32's speed, and MFU against it read 7,000%).
  if (widens_reduced_matmul(dtype, device)) dtype = at::kFloat;
  const int64_t n = device.is_cpu() ? 1024 : 8192;
  auto opts = at::TensorOptions().dtype(dtype).device(device);
  const at::Tensor a = at::randn({n, n}, opts), b = at::randn({n, n}, opts);
  return best_matmul_flops(a, b, /*min_iters=*/3, budget_s);
}

namespace {

// Dense bf16 tensor-core peaks (no sparsity), most specific names first.
struct PeakEntry {
  const char* must_contain;
  const char* or_variant;  // also required when set ("PCIe", "NVL")
  double flops;
};
constexpr PeakEntry kPeaks[] = {
    {"GH200", nullptr, 989e12},    {"H100", "NVL", 835e12},      {"H100", "PCIe", 756e12},
    {"H100", nullptr, 989e12},     {"H800", nullptr, 989e12},    {"H200", nullptr, 989e12},
    {"H20", nullptr, 148e12},      {"GB200", nullptr, 2.5e15},   {"B200", nullptr, 2.25e15},
    {"A100", nullptr, 312e12},     {"A800", nullptr, 312e12},    {"L40S", nullptr, 362e12},
    {"MI355X", nullptr, 2.5e15},   {"MI325X", nullptr, 1307e12}, {"MI300X", nullptr, 1307e12},
    {"MI300A", nullptr, 980.6e12}, {"MI250X", nullptr, 383e12},
};

// `name` has `word` as a whole word (so "H20" does not match "H200", nor "B200" "GB200").
bool has_word(const std::string& name, const std::string& word) {
  for (size_t at = name.find(word); at != std::string::npos; at = name.find(word, at + 1)) {
    const bool left = at == 0 || !std::isalnum(static_cast<unsigned char>(name[at - 1]));
    const size_t end = at + word.size();
    const bool right = end == name.size() || !std::isalnum(static_cast<unsigned char>(name[end]));
    if (left && right) return true;
  }
  return false;
}

}  // namespace

std::optional<double> datasheet_peak_flops(const std::string& device_name) {
  // Names also come as "NVIDIA A100-SXM4-80GB": '-' separates words there.
  for (const PeakEntry& e : kPeaks) {
    if (!has_word(device_name, e.must_contain)) continue;
    if (e.or_variant != nullptr && device_name.find(e.or_variant) == std::string::npos) continue;
    return e.flops;
  }
  return std::nullopt;
}

int64_t drop_metrics_rows_after(const std::string& path, int64_t step) {
  if (!non_regular_file_kind(path).empty()) return 0;  // absent, or e.g. a link to /dev/null
  std::istringstream lines(read_regular_file(path, "metrics file"));
  std::string kept, line;
  int64_t dropped = 0;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool superseded = row.is_discarded() ||
                            (row.is_object() && row.contains("step") &&
                             row["step"].is_number_integer() && row["step"].get<int64_t>() > step);
    if (superseded) {
      ++dropped;
    } else {
      kept += line + "\n";
    }
  }
  if (dropped > 0) replace_file(path, kept);
  return dropped;
}

std::string metrics_file_name(const MetricsSection& config, int64_t rank) {
  if (config.save_for_all_ranks) return "metrics_rank_" + std::to_string(rank) + ".jsonl";
  return rank == 0 ? "metrics.jsonl" : "";
}

MetricsLogger::MetricsLogger(const MetricsSection& config, const std::string& dump_folder,
                             double flops_per_token, double peak_flops, int64_t total_steps,
                             bool write_file, int64_t start_step, int64_t rank,
                             const at::Device& device, int64_t tb_started)
    : config_(config),
      device_(device),
      flops_per_token_(flops_per_token),
      peak_flops_(peak_flops),
      total_steps_(total_steps),
      colors_(!config.disable_color_printing && isatty(fileno(stdout))) {
  TITAN_CHECK(peak_flops > 0, "peak FLOP/s must be positive for MFU, got ", peak_flops);
  if (device_.is_cuda()) {
    device_memory_ = device_info(device_).total_memory;
    reset_device_memory_stats(device_);  // the first window starts here, not at model build
  }
  if (write_file) {
    std::filesystem::create_directories(dump_folder);
    const std::string name = metrics_file_name(config, rank);
    jsonl_path_ =
        (std::filesystem::path(dump_folder) / (name.empty() ? "metrics.jsonl" : name)).string();
    const int64_t dropped = start_step > 0 ? drop_metrics_rows_after(jsonl_path_, start_step) : 0;
    jsonl_fd_ =
        ::open(jsonl_path_.c_str(),
               O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (start_step > 0 ? 0 : O_TRUNC), 0644);
    if (jsonl_fd_ < 0) {
      throw DataError("cannot write metrics file " + jsonl_path_ + ": " + std::strerror(errno));
    }
    if (start_step > 0) {
      if (dropped > 0) {
        log_info(jsonl_path_, ": dropped ", dropped, " row(s) after step ", start_step,
                 " (logged by the interrupted run; this run logs those steps again)");
      }
      append_row(
          nlohmann::json{{"event", "resume"}, {"step", start_step}, {"dropped_rows", dropped}}
              .dump());
    }
    if (config.enable_tensorboard) {
      const int64_t started =
          tb_started > 0 ? tb_started : static_cast<int64_t>(std::time(nullptr));
      tb_ = std::make_unique<TensorBoardWriter>(
          tensorboard_folder(config, dump_folder, rank, started));
      log_info("TensorBoard logging enabled; event file ", tb_->path());
    }
  }
  start_ = last_log_ = std::chrono::steady_clock::now();
  last_log_step_ = start_step;
}

MetricsLogger::~MetricsLogger() {
  if (jsonl_fd_ >= 0) ::close(jsonl_fd_);
}

void MetricsLogger::close() {
  if (tb_) tb_->close();
  if (jsonl_fd_ < 0) return;
  const int fd = jsonl_fd_;
  jsonl_fd_ = -1;
  close_checked(fd, jsonl_path_);
}

// One write(2) per row: with O_APPEND a row is never interleaved with another writer's.
void MetricsLogger::append_row(const std::string& json_line) {
  if (jsonl_fd_ >= 0) write_all(jsonl_fd_, json_line + "\n", jsonl_path_);
}

std::string MetricsLogger::color(const char* code) const { return colors_ ? code : ""; }

static std::string format_duration(double s) {
  int64_t t = static_cast<int64_t>(std::llround(s));
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", (long long)(t / 3600),
                (long long)(t / 60 % 60), (long long)(t % 60));
  return buf;
}

bool MetricsLogger::logs_at(int64_t step) const {
  return step % config_.log_freq == 0 || step == total_steps_ || step == 1;
}

std::optional<StepMetrics> MetricsLogger::on_step(int64_t step, int64_t tokens,
                                                  const std::function<LoggedValues()>& values) {
  tokens_since_log_ += tokens;
  if (!logs_at(step)) return std::nullopt;

  // The values first: reading them waits for the device, so the window's time covers the work.
  const LoggedValues v = values();
  auto now = std::chrono::steady_clock::now();
  const double window = std::chrono::duration<double>(now - last_log_).count();
  StepMetrics m;
  m.step = step;
  m.loss = v.loss;
  m.auxiliary = v.auxiliary;
  m.grad_norm = v.grad_norm;
  m.lr = v.lr;
  m.host_syncs = v.host_syncs;
  m.host_syncs_between_logs = v.host_syncs_between_logs;
  m.comm_ops = v.comm_ops;
  m.tps = window > 0 ? static_cast<double>(tokens_since_log_) / window : 0.0;
  m.tflops = flops_per_token_ * m.tps / 1e12;
  m.mfu = 100.0 * flops_per_token_ * m.tps / peak_flops_;
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  if (device_.is_cuda()) {
    const DeviceMemoryStats mem = device_memory_stats(device_);
    const double total = static_cast<double>(std::max<int64_t>(1, device_memory_));
    m.max_active_gib = static_cast<double>(mem.max_active_bytes) / kGiB;
    m.max_active_pct = 100.0 * static_cast<double>(mem.max_active_bytes) / total;
    m.max_reserved_gib = static_cast<double>(mem.max_reserved_bytes) / kGiB;
    m.max_reserved_pct = 100.0 * static_cast<double>(mem.max_reserved_bytes) / total;
    m.alloc_retries = mem.alloc_retries;
    m.ooms = mem.ooms;
    m.memory_gib = m.max_reserved_gib;
    m.memory_pct = m.max_reserved_pct;
    if (mem.alloc_retries > 0) {
      log_warning(mem.alloc_retries,
                  " CUDA memory allocation retries since the last log (the "
                  "allocator freed its cache to satisfy a request: memory is fragmented or "
                  "nearly full; step time suffers). HINT: lower training.local_batch_size, or "
                  "use activation checkpointing");
    }
    reset_device_memory_stats(device_);
  } else {
    const int64_t rss = peak_rss_bytes();
    m.memory_gib = static_cast<double>(rss) / kGiB;
    m.memory_pct = 100.0 * static_cast<double>(rss) / static_cast<double>(total_ram_bytes());
  }
  m.elapsed_s = std::chrono::duration<double>(now - start_).count();
  m.step_time_s = window / static_cast<double>(std::max<int64_t>(1, step - last_log_step_));
  m.eta_s = m.step_time_s * static_cast<double>(total_steps_ - step);

  std::string auxiliary;  // "  mtp_loss: 5.1234"
  for (const auto& [name, value] : m.auxiliary) {
    char field[96];
    std::snprintf(field, sizeof(field), "  %s: %7.4f", name.c_str(), value);
    auxiliary += field;
  }
  char line[640];
  std::snprintf(
      line, sizeof(line),
      "%sstep: %*lld  %sloss: %7.4f%s  %sgrad_norm: %7.4f  %slr: %.2e  %smemory: "
      "%5.2fGiB(%.2f%%)  %stps: %s  %stflops: %.2f  %smfu: %.2f%%%s  elapsed: %s  eta: %s",
      color("\033[31m").c_str(), static_cast<int>(std::to_string(total_steps_).size()),
      (long long)step, color("\033[32m").c_str(), m.loss, auxiliary.c_str(),
      color("\033[33m").c_str(), m.grad_norm, color("\033[35m").c_str(), m.lr,
      color("\033[36m").c_str(), m.memory_gib, m.memory_pct, color("\033[34m").c_str(),
      with_commas(std::llround(m.tps)).c_str(), color("\033[36m").c_str(), m.tflops,
      color("\033[33m").c_str(), m.mfu, color("\033[0m").c_str(),
      format_duration(m.elapsed_s).c_str(), format_duration(m.eta_s).c_str());
  log_info(line);
  write_json(m);
  if (tb_) tb_->add_scalars(step, tensorboard_scalars(m, device_.is_cuda()));

  tokens_since_log_ = 0;
  last_log_ = std::chrono::steady_clock::now();
  last_log_step_ = step;
  return m;
}

void MetricsLogger::log_validation(int64_t step, double loss, int64_t tokens, double seconds,
                                   bool perplexity) {
  char ppl[64] = "";
  if (perplexity) std::snprintf(ppl, sizeof(ppl), "perplexity: %.3f  ", std::exp(loss));
  char line[256];
  std::snprintf(line, sizeof(line),
                "%svalidate step: %lld  %svalidation_loss: %7.4f  %stokens: %s  (%.1fs)%s",
                color("\033[33m").c_str(), (long long)step, color("\033[32m").c_str(), loss, ppl,
                with_commas(tokens).c_str(), seconds, color("\033[0m").c_str());
  log_info(line);
  nlohmann::json row{{"step", step},
                     {"validation_loss", loss},
                     {"validation_tokens", tokens},
                     {"validation_s", seconds}};
  if (perplexity) row["validation_perplexity"] = std::exp(loss);
  append_row(row.dump());
  if (tb_) {
    std::vector<Scalar> scalars = {{"validation_metrics/loss", loss}};
    if (perplexity) scalars.push_back({"validation_metrics/perplexity", std::exp(loss)});
    tb_->add_scalars(step, scalars);
  }
}

std::vector<Scalar> tensorboard_scalars(const StepMetrics& m, bool cuda) {
  std::vector<Scalar> s = {{"loss_metrics/global_avg_loss", m.loss},
                           {"grad_norm", m.grad_norm},
                           {"lr", m.lr},
                           {"throughput(tps)", m.tps},
                           {"tflops", m.tflops},
                           {"mfu(%)", m.mfu},
                           {"time_metrics/end_to_end(s)", m.step_time_s}};
  for (const auto& [name, value] : m.auxiliary) s.push_back({"loss_metrics/" + name, value});
  if (cuda) {
    s.insert(s.end(), {{"memory/max_active(GiB)", m.max_active_gib},
                       {"memory/max_active(%)", m.max_active_pct},
                       {"memory/max_reserved(GiB)", m.max_reserved_gib},
                       {"memory/max_reserved(%)", m.max_reserved_pct},
                       {"memory/num_alloc_retries", static_cast<double>(m.alloc_retries)},
                       {"memory/num_ooms", static_cast<double>(m.ooms)}});
  } else {
    s.insert(s.end(), {{"memory/max_rss(GiB)", m.memory_gib}, {"memory/max_rss(%)", m.memory_pct}});
  }
  return s;
}

void MetricsLogger::write_json(const StepMetrics& m) {
  nlohmann::json j = {{"step", m.step},
                      {"loss", m.loss},
                      {"grad_norm", m.grad_norm},
                      {"lr", m.lr},
                      {"tps", m.tps},
                      {"tflops", m.tflops},
                      {"mfu", m.mfu},
                      {"memory_gib", m.memory_gib},
                      {"memory_pct", m.memory_pct},
                      {"time_metrics/end_to_end(s)", m.step_time_s},
                      {"elapsed_s", m.elapsed_s}};
  for (const auto& [name, value] : m.auxiliary) j[name] = value;
  if (m.host_syncs >= 0) {
    j["host_syncs"] = m.host_syncs;
    j["host_syncs_between_logs"] = m.host_syncs_between_logs;
  }
  if (m.comm_ops >= 0) j["comm_ops"] = m.comm_ops;
  if (device_.is_cuda()) {
    j["memory/max_active(GiB)"] = m.max_active_gib;
    j["memory/max_active(%)"] = m.max_active_pct;
    j["memory/max_reserved(GiB)"] = m.max_reserved_gib;
    j["memory/max_reserved(%)"] = m.max_reserved_pct;
    j["memory/num_alloc_retries"] = m.alloc_retries;
    j["memory/num_ooms"] = m.ooms;
  }
  append_row(j.dump());
}

}  // namespace titan
