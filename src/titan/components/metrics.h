// Training metrics: the per-step log line (TorchTitan's fields plus lr and ETA), the same numbers
// as JSON lines in <dump_folder>/metrics.jsonl, peak memory, and the peak-FLOP/s used for MFU.
//
// metrics.jsonl holds one row per logged step ({"step", "loss", ...}) and per validation
// ({"step", "validation_loss", ...}). Every row is written with one checked write(2): a full disk
// ends the run with a DataError naming the file and the errno text, never a silent loss. A run
// resumed from the checkpoint of step S first drops the rows with "step" > S that an interrupted
// run logged (they are about to be logged again), then appends the marker row
// {"event": "resume", "step": S, "dropped_rows": N}, so every step appears once.
//
// With metrics.save_for_all_ranks every rank writes its own file, metrics_rank_<rank>.jsonl
// (TorchTitan's per-rank logging), rank 0 included.
//
// With metrics.enable_tensorboard the ranks that write a metrics file also write the same values
// as TensorBoard scalars under TorchTitan's names (tensorboard_scalars; the event files are
// described in tensorboard.h).
#pragma once

#include "titan/components/tensorboard.h"
#include "titan/config/job_config.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace titan {

// The metrics file rank `rank` writes under dump_folder: "metrics.jsonl" (rank 0), or
// "metrics_rank_<rank>.jsonl" for every rank with metrics.save_for_all_ranks; "" when this rank
// writes none.
std::string metrics_file_name(const MetricsSection& config, int64_t rank);

// Peak resident set size of this process so far, in bytes.
int64_t peak_rss_bytes();
// Physical memory of the machine, in bytes.
int64_t total_ram_bytes();

// Drops the rows of the metrics file `path` whose "step" is > `step` (and lines that are not JSON,
// such as a line torn by a kill), replacing the file atomically; returns how many were dropped.
// A missing or non-regular file is left alone (0).
int64_t drop_metrics_rows_after(const std::string& path, int64_t step);

// Measures the FLOP/s of a square GEMM in `dtype` on `device` (on the CPU with the current thread
// settings; 1024^3 there, 8192^3 on a GPU): the best of several timed multiplies over about
// `budget_s` seconds. A 16-bit dtype on a CPU without fast bf16 GEMMs is probed in float32, the
// precision titan multiplies it in there (widens_reduced_matmul).
double probe_peak_flops(at::ScalarType dtype, double budget_s = 0.3,
                        const at::Device& device = at::kCPU);

// Dense bf16 peak FLOP/s of one accelerator from its name as the driver reports it ("NVIDIA
// H100 80GB HBM3", "AMD Instinct MI300X", ...): the datasheet figures TorchTitan uses for MFU.
// nullopt for a device not in the table.
std::optional<double> datasheet_peak_flops(const std::string& device_name);

// What the caller reads for a logged step (only then: on a GPU each read waits for the device).
struct LoggedValues {
  double loss = 0.0;
  double grad_norm = 0.0;
  double lr = 0.0;
  // The model's auxiliary losses (multi-token prediction's mtp_loss), by name.
  std::vector<std::pair<std::string, double>> auxiliary;
  // Device-to-host reads (titan/common/host_sync.h) of the logged step up to its row, and the
  // most any other step made since the previous row; -1 when not counted.
  int64_t host_syncs = -1;
  int64_t host_syncs_between_logs = -1;
  // Communication ops this rank issued in the logged step (FlightRecorder::recorded); -1: not
  // counted (one process, or comm.trace_buf_size = 0).
  int64_t comm_ops = -1;
};

struct StepMetrics {
  int64_t step = 0;
  double loss = 0.0;
  std::vector<std::pair<std::string, double>> auxiliary;  // see LoggedValues
  double grad_norm = 0.0;
  double lr = 0.0;
  int64_t host_syncs = -1;  // see LoggedValues
  int64_t host_syncs_between_logs = -1;
  int64_t comm_ops = -1;    // see LoggedValues
  double tps = 0.0;         // tokens/s per rank since the previous log
  double tflops = 0.0;      // achieved TFLOP/s per rank
  double mfu = 0.0;         // percent of peak
  double memory_gib = 0.0;  // peak RSS (CPU); max reserved in this window (CUDA)
  double memory_pct = 0.0;  // of RAM (CPU) / of the device's memory (CUDA)
  // CUDA only (TorchTitan's memory/ fields), for the log window: peaks of live tensors and of
  // allocator-held memory, allocation retries (cudaMalloc failures recovered by freeing the
  // cache; a sign of fragmentation) and out-of-memory errors.
  double max_active_gib = 0.0;
  double max_active_pct = 0.0;
  double max_reserved_gib = 0.0;
  double max_reserved_pct = 0.0;
  int64_t alloc_retries = 0;
  int64_t ooms = 0;
  double step_time_s = 0.0;  // mean wall time per step in the log window
  double elapsed_s = 0.0;
  double eta_s = 0.0;
};

// A logged step's TensorBoard scalars, TorchTitan's tags, each with the metrics.jsonl key that
// holds the same value: loss_metrics/global_avg_loss (loss), grad_norm, lr, throughput(tps)
// (tps), tflops, mfu(%) (mfu), time_metrics/end_to_end(s); memory/max_active and max_reserved
// (GiB and %), num_alloc_retries and num_ooms on CUDA (same keys), memory/max_rss(GiB) and (%)
// (memory_gib, memory_pct) elsewhere.
std::vector<Scalar> tensorboard_scalars(const StepMetrics& m, bool cuda);

class MetricsLogger {
 public:
  // `flops_per_token` per TorchTitan's formula; `peak_flops` per rank (> 0). A run resumed after
  // `start_step` keeps metrics.jsonl's rows up to that step and appends a resume marker instead
  // of truncating it (see the top of this file). `rank` names the file under
  // metrics.save_for_all_ranks (metrics_file_name).
  // On a CUDA `device` memory is the allocator's (reset every log window), else the process's
  // peak RSS. With metrics.enable_tensorboard and `write_file`, TensorBoard files go to
  // tensorboard_folder(), its timestamp from `tb_started` (Unix seconds; 0: now), which
  // the ranks agree on under save_for_all_ranks so they share one folder.
  MetricsLogger(const MetricsSection& config, const std::string& dump_folder,
                double flops_per_token, double peak_flops, int64_t total_steps, bool write_file,
                int64_t start_step = 0, int64_t rank = 0, const at::Device& device = at::kCPU,
                int64_t tb_started = 0);
  ~MetricsLogger();
  MetricsLogger(const MetricsLogger&) = delete;
  MetricsLogger& operator=(const MetricsLogger&) = delete;

  // Whether step `step` is logged: log_freq boundaries, the first and the last step.
  bool logs_at(int64_t step) const;
  // Called every step with the tokens this rank processed; on a logged step (logs_at) it calls
  // `values`, logs a line and a metrics.jsonl row, and returns the metrics.
  std::optional<StepMetrics> on_step(int64_t step, int64_t tokens,
                                     const std::function<LoggedValues()>& values);
  // `perplexity`: the loss is a cross-entropy, whose exponential is logged beside it (not for
  // a regression loss such as a diffusion model's).
  void log_validation(int64_t step, double loss, int64_t tokens, double seconds,
                      bool perplexity = true);

  const std::string& jsonl_path() const { return jsonl_path_; }
  // The TensorBoard event file; "" when this rank writes none.
  std::string tensorboard_path() const { return tb_ ? tb_->path() : ""; }
  // Closes metrics.jsonl and the TensorBoard file, throwing DataError when a close reports a
  // lost write (NFS, quota).
  void close();

 private:
  void write_json(const StepMetrics& m);
  void append_row(const std::string& json_line);
  std::string color(const char* code) const;

  MetricsSection config_;
  at::Device device_;
  int64_t device_memory_ = 0;  // bytes (CUDA)
  double flops_per_token_;
  double peak_flops_;
  int64_t total_steps_;
  std::string jsonl_path_;
  int jsonl_fd_ = -1;
  std::unique_ptr<TensorBoardWriter> tb_;
  bool colors_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_log_;
  int64_t tokens_since_log_ = 0;
  int64_t last_log_step_ = 0;
};

}  // namespace titan
