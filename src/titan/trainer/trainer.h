// The training loop: train() -> train_step() -> ParallelizedModel::forward_backward(), with
// construction split into small build_* steps. The trainer knows models only through the registry
// (ModelSpec) and the Model interface; it never names a model.
#pragma once

#include "titan/common/folder_lock.h"
#include "titan/components/lr_scheduler.h"
#include "titan/components/metrics.h"
#include "titan/components/optimizer.h"
#include "titan/config/job_config.h"
#include "titan/distributed/comm.h"
#include "titan/models/registry.h"
#include "titan/parallel/parallelized_model.h"

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace titan {

class Tokenizer;
class BatchLoader;
class FlowMatching;
struct FluxTokenizers;
class ImageCaptionSource;
class ChatEncoder;
class DocumentSource;
class RecordSource;
struct Batch;
class ParallelDims;
struct DistributedContext;
class TraceProfiler;
class MemoryProfiler;
namespace ckpt {
class CheckpointManager;
}
namespace ft {
class Manager;
class OuterStep;
}  // namespace ft

// Progress that checkpoints carry (TorchTitan's TrainState).
struct TrainState {
  int64_t step = 0;         // last completed step
  int64_t tokens_seen = 0;  // training tokens consumed by the whole job (every data rank)
};

// What one optimizer step leaves on the device. Nothing of it is read back during the step (see
// titan/common/host_sync.h): the trainer reads the values of every step since the last read in
// one transfer, on logged steps and before validation, checkpoints and the end.
struct StepResult {
  at::Tensor loss;       // 0-d float64: mean loss over the global batch
  at::Tensor grad_norm;  // 0-d float64: global gradient norm before clipping
  // 0-d float64 means over the global batch of the model's auxiliary losses (multi-token
  // prediction's mtp_loss), by name.
  std::map<std::string, at::Tensor> auxiliary;
  // Fault-tolerant replica groups: false when averaging over the quorum failed (a replica group
  // died or hung): the optimizer did not step and the step is run again with the next batch.
  bool committed = true;
};

// What train() reports back (also used by tests).
struct TrainResult {
  std::vector<double> losses;             // loss of every step (mean over the global batch)
  std::vector<double> grad_norms;         // pre-clip grad norm of every step
  std::vector<double> validation_losses;  // one per validation run
  // Auxiliary losses (multi-token prediction's mtp_loss) of every step, by name.
  std::map<std::string, std::vector<double>> auxiliary_losses;
  int64_t steps = 0;       // last step reached (== training.steps when done)
  int64_t start_step = 1;  // first step this run executed (> 1 after resuming)
  double seconds = 0.0;
};

// Data parallelism: every rank reads the same global stream of sequences and takes its slice of
// each micro-batch (dp rank r of D: rows [r * B, (r + 1) * B) of D * B), so a step's global batch
// is the same for every layout (1 process, FSDP, HSDP, DDP) with the same global batch size, and
// the loader state in a checkpoint fits any layout.
class Trainer {
 public:
  // `dist`: the job's ranks (init_distributed); null or one rank trains in this process alone.
  explicit Trainer(JobConfig config, const DistributedContext* dist = nullptr);
  ~Trainer();

  TrainResult train();

  // One optimizer step over `accumulation_steps()` micro-batches from the data loader: the mean
  // loss over the micro-batches and the gradient norm, on the device (no host read).
  StepResult train_step(int64_t step);

  // Mean next-token loss over the validation set (validation.steps batches, or all).
  double validate(int64_t* tokens = nullptr);

  Model& model() { return *model_; }
  // The model as this rank trains it (its pieces with their boxes; see parallelized_model.h).
  ParallelizedModel& parallelized() { return *parallel_; }
  Optimizer& optimizer() { return *optimizer_; }
  int64_t accumulation_steps() const { return accumulation_steps_; }
  const JobConfig& config() const { return config_; }
  const TrainState& train_state() const { return train_state_; }
  // What the optimizer trains, by parameter name: the model's parameters, or this rank's shards
  // of them under FSDP / tensor parallelism.
  std::vector<std::pair<std::string, at::Tensor>> trained_params() const;
  int64_t rank() const { return rank_; }
  // Where this rank computes (training.device; see titan/common/device.h).
  const at::Device& device() const { return device_; }
  // The job's world group (every other group is made from it); null when training alone.
  dist::Group* world_group() const { return world_.get(); }

 private:
  void build_model();
  void build_data();
  // Image-caption data (trainer_images.cpp), in place of build_data's token streams: with the
  // frozen encoders of a flow-matching model (FLUX), or as a vision-language model's sequences.
  void build_image_data();
  // The vision-language model's image-text data (trainer_images.cpp).
  void build_image_text_data();
  // ConfigError when the validation image dataset cannot fill one batch.
  void check_validation_images_fill_a_batch() const;
  // A loader of `section`'s image dataset ("training" or "validation"), global rows.
  std::unique_ptr<BatchLoader> make_image_loader(const std::string& section, int64_t batch_size,
                                                 bool infinite) const;
  // Tokens per sample for throughput and MFU: training.seq_len, or a flow-matching model's
  // image tokens.
  int64_t sample_tokens() const;
  void build_optimizer();
  // The checkpoint manager with the state entries; resumes (or loads initial_load_path).
  void build_checkpoint();
  // Fills the parameters from a Hugging Face folder of the base model (adapters stay as they are).
  void load_hf_base(const std::string& hf_dir);
  // QLoRA (lora.quantize_base): the base from checkpoint.initial_load_path, its frozen block
  // linears then held in NF4, before the checkpoint's state lists the parameters.
  void load_and_quantize_base();
  // checkpoint.last_save_in_hf: the final model as a Hugging Face folder <folder>/step-N-hf.
  void save_final_hf(int64_t step);
  void build_metrics();
  // [profiling]: traces and memory snapshots (before the model, so that memory counts it).
  void build_profiling();
  void build_parallelism(const DistributedContext* dist);
  // On the CPU in bf16: one matmul path for every rank (the slowest measurement decides).
  void agree_cpu_matmul_path();
  // Rank 0 locks job.dump_folder (no second run may share it); every rank throws if it cannot.
  void lock_dump_folder();
  // This rank's rows of a global micro-batch from `loader` (batch dp_size * local), on the
  // device (copied from pinned host memory without blocking on CUDA).
  std::optional<Batch> next_local_batch(BatchLoader& loader);
  // This rank's rows of a global batch, on the device.
  Batch local_batch(Batch batch) const;
  // A loader of `section`'s dataset ("training" or "validation"): the packed document stream,
  // or packed conversations for the dataset "chat" (sft_data.h).
  std::unique_ptr<BatchLoader> make_loader(const std::string& section, int64_t seq_len,
                                           int64_t batch_size, bool infinite,
                                           int64_t shuffle_seed) const;
  // [fault_tolerance] (trainer_ft.cpp): joins the lighthouse's quorums as replica group
  // fault_tolerance.replica_id.
  void build_fault_tolerance();
  // The quorum of the next step; takes the state of a peer when this replica is behind (or
  // new), and gives its own to those that are.
  void begin_ft_step();
  // Semi-synchronous training: a quorum, the average of the parameters or pseudo-gradients over
  // the replicas that do not recover, then the state to those that do. Before the first step
  // and every fault_tolerance.sync_steps steps (and after the last).
  void ft_sync_round();
  // Logs the quorum when its members changed: who joined and who left.
  void log_ft_quorum();
  // Takes a peer's state or gives this replica's, as the quorum says (neither: nothing);
  // TrainingError when this replica's state is invalid and no one gives it a valid one.
  void move_ft_state();
  // Averages the gradients, the loss and the auxiliary losses over the quorum; false when that
  // failed on any rank of this replica group (the step must not commit).
  bool ft_average(StepResult& result);
  // What a recovering replica takes from its source: every tensor of the training state, and
  // the rest (step, tokens seen, optimizer step count, data loader position) as JSON.
  std::vector<at::Tensor> ft_state_tensors() const;
  std::string ft_state_blob() const;
  void apply_ft_state_blob(const std::string& blob);
  // This rank's rows of a global batch of `parts` x local rows, on the device.
  Batch slice_batch(Batch batch, int64_t parts, int64_t index) const;
  // Reads the loss and gradient norm of every step not read yet in one host read, appends them to
  // `result`, and throws TrainingError naming the first step whose loss or norm is not finite.
  void settle_steps(TrainResult& result);

  JobConfig config_;
  // Rank 0 holds job.dump_folder for the whole run (declared first: released last).
  std::unique_ptr<FolderLock> dump_lock_;
  at::ScalarType compute_dtype_ = at::kFloat;
  at::Device device_ = at::kCPU;
  int64_t seed_ = 0;
  int64_t accumulation_steps_ = 1;
  // Steps whose (loss, gradient norm) are still on the device: (step, (2) float64).
  std::vector<std::pair<int64_t, at::Tensor>> unsettled_;
  std::vector<std::string> auxiliary_names_;  // the auxiliary losses' columns of unsettled_
  // The last step's max/mean expert load of each MoE layer on this rank (no layers: a dense
  // model), on the device until a logged step reads it.
  MoELoads moe_loads_;
  const ModelSpec* spec_ = nullptr;
  std::shared_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  // FLUX: the captions' tokenizers (tokenizer_ under training.test_mode, else T5's and CLIP's).
  std::unique_ptr<FluxTokenizers> flux_tokenizers_;
  std::unique_ptr<BatchLoader> train_loader_;
  // Opened once (the index of a corpus on disk); a validation run reads them from the start.
  std::shared_ptr<const DocumentSource> train_docs_, validation_docs_;
  std::shared_ptr<const RecordSource> train_chats_, validation_chats_;
  std::unique_ptr<ChatEncoder> chat_encoder_;  // chat datasets: the model's chat template
  // Flow-matching models (FLUX): the frozen encoders and noising that turn a rank's image rows
  // into the model's batch (null for decoders), and the image datasets.
  std::unique_ptr<FlowMatching> flow_;
  std::shared_ptr<const ImageCaptionSource> train_images_, validation_images_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<LRScheduler> lr_scheduler_;
  std::unique_ptr<ckpt::CheckpointManager> checkpointer_;
  std::unique_ptr<MetricsLogger> metrics_;
  std::unique_ptr<TraceProfiler> trace_profiler_;
  std::unique_ptr<MemoryProfiler> memory_profiler_;
  int64_t rank_ = 0;
  int64_t world_size_ = 1;
  int64_t dp_size_ = 1;
  int64_t dp_rank_ = 0;
  // The training data's split: the data-parallel ranks of this job, times the replica groups
  // under fault tolerance (each group reads its slice of one global stream).
  int64_t data_dp_size_ = 1;
  int64_t data_dp_rank_ = 0;
  std::unique_ptr<ft::Manager> ft_;
  std::unique_ptr<ft::OuterStep> ft_outer_;  // semi-synchronous training's outer step
  bool ft_joined_ = false;                   // a semi-synchronous replica has had its first round
  bool ft_state_valid_ = true;               // false while a recovery from a peer is incomplete
  int64_t ft_quorum_id_ = -1;                // the quorum of the last step (its changes are logged)
  std::vector<int64_t> ft_members_;
  std::shared_ptr<dist::Group> world_;
  std::shared_ptr<dist::FlightRecorder> flight_recorder_;  // null: one process, or turned off
  std::unique_ptr<ParallelDims> dims_;
  std::unique_ptr<ParallelizedModel> parallel_;
  TrainState train_state_;
  bool already_complete_ = false;  // the folder holds this run's final model-only checkpoint
};

}  // namespace titan
