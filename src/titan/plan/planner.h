// The layout planner behind `titan plan`: for a model, a sequence length, a global batch and a
// cluster (nodes x devices, each with memory, peak FLOP/s and link bandwidths), it enumerates
// the layouts the trainer accepts (dp_replicate, dp_shard, cp, tp, pp, ep, activation
// checkpointing, local batch, pipeline schedule), predicts each one's per-device memory and step
// time from the explicit cost model below, and ranks them. Pure arithmetic on the model's
// analytic stats (ModelSpec::describe): nothing is allocated, nothing communicates.
//
// Memory is estimate_training_memory (plan/memory_estimate.h) with the MemoryOptions of
// training_memory_options() (memory_options.h): the very function `titan train` checks at
// start-up and `titan inspect` prints, so the three never disagree.
//
// Step time, per device, for a step of the global batch G sequences of T tokens on W devices:
//   compute   = flops_per_token(T) * G * T / W * (1 + r / 3) / (peak * mfu)
//               flops_per_token is the trainer's MFU formula (6 * N_active_non_embedding +
//               12 * L * H * head_dim * T); r is the share of the forward that activation
//               checkpointing recomputes: none 0, full 1, every k-th block 1 / k, "op" half of
//               the matmuls (it saves every second matmul's output and the attention kernel's).
//               `mfu` is the efficiency of the work actually done, recomputation included; the
//               MFU printed (TorchTitan's) counts useful FLOPs only.
//   collectives, bytes per device (ring volumes: an all-gather / reduce-scatter of a tensor of
//   X bytes moves X (n-1)/n, an all-reduce 2 X (n-1)/n) at the link's bandwidth, plus a fixed
//   latency per collective (Hardware::latency_s), each over the intra-node link when its
//   group fits in one node (mesh order pp, dp_replicate, dp_shard, cp, tp, innermost fastest:
//   a group fits when its span, its own size times the degrees inside it, is at most the
//   devices per node), else over the inter-node link:
//     FSDP    per forward-backward (per microbatch under PP), all-gather of the rank's bf16
//             parameters (params / (tp pp)) in forward and again in backward (titan reshards
//             after forward unless fsdp_reshard_after_forward = "never", which is also what
//             "default" means under PP: then once, and the memory estimate counts the whole
//             stage gathered), reduce-scatter of the gradients in
//             training.mixed_precision_reduce (float32); over dp_shard x cp
//             (routed experts: their own 1 / ep share, 1 / (ep tp) with etp = tp, over
//             dp_shard_mod_ep = dp_shard x cp x tp / ep, or dp_shard x cp / ep with etp = tp)
//     HSDP/DDP all-reduce of the (sharded) gradients across dp_replicate, as often
//     TP      sequence parallelism: per block 2 all-gathers + 2 reduce-scatters of the (batch,
//             seq / cp, dim) activations in forward, as many in backward, plus the embedding's
//             and the output's; recomputation repeats the forward's share r. An MoE block
//             with etp 1 runs its experts on the rank's sequence shard: only attention's 2 + 2;
//             with no ep either, its whole experts are replicated over tp and their gradients
//             are all-reduced over tp once per step (fp32, after the FSDP reduce-scatter)
//     CP      ring attention: each block passes every K/V chunk around the ring (cp - 1 steps)
//             in forward, K/V and their gradients in backward (x 2), plus the recomputation
//     EP      all-to-all of the routed tokens (top_k copies of each, dim wide) to and from the
//             experts, per MoE block, in forward and backward; tokens of the rank's sequence
//             shard (seq / (cp tp)), or with etp = tp of the whole (seq / cp) on every tp rank
//     PP      send/recv of one microbatch's (seq / cp, dim / tp) activations between stages,
//             forward and backward, as the latency of every cross-rank hop in the simulation
//   overlap (GPU, Hardware::comm_overlaps_compute): FSDP / HSDP / DDP traffic runs behind the
//   compute (exposed: what the compute cannot hide, and at least one unit's share, the first
//   all-gather and the last reduce-scatter); TP, CP and EP collectives sit on the critical path
//   (exposed in full). On a CPU nothing overlaps: collectives run on the cores that compute.
//   pipeline: the schedule's own table (generate_schedule) simulated (simulate_schedule) with
//             forward = 1, backward = 2 + r units of one microbatch-stage's compute and the
//             send/recv time as the hop latency; bubble = the idle time at zero latency, the
//             rest of the makespan's growth is exposed PP communication.
//   step = accumulation steps x (compute + bubble + exposed TP/CP/EP/PP) + exposed FSDP/DP.
#pragma once

#include "titan/config/job_config.h"
#include "titan/distributed/parallel_dims.h"
#include "titan/parallel/pipeline_schedule.h"
#include "titan/plan/memory_estimate.h"
#include "titan/plan/memory_options.h"
#include "titan/plan/pipeline_split.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace titan {

// One accelerator (or, for --cpu, one rank's share of this machine) and its links.
struct Hardware {
  std::string name;           // "H100 SXM", "this CPU"
  double memory_bytes = 0;    // per device
  double reserved_bytes = 0;  // per device, not for training (runtime, context, fragmentation)
  double peak_flops = 0;      // per device, in the compute dtype
  double intra_node_bps = 0;  // bytes/s per device over the link inside a node
  double inter_node_bps = 0;  // bytes/s per device across nodes
  bool comm_overlaps_compute = true;
  double latency_s = 0;  // per collective (and per pipeline hop), whatever its size
};

// H100 / H200 / A100 (SXM, bf16 dense peak; NVLink and 400 / 200 Gb/s InfiniBand per GPU).
// ConfigError naming `flag` and the presets when unknown.
Hardware gpu_preset(const std::string& name, const std::string& flag = "--gpu");
std::vector<std::string> gpu_preset_names();

// The most devices a plan may span (nodes x gpus_per_node).
constexpr int64_t kMaxPlanDevices = int64_t{1} << 20;

struct PlanRequest {
  JobConfig config;  // model, training.seq_len / global_batch_size / dtypes, pipeline keys
  int64_t nodes = 1;
  int64_t gpus_per_node = 8;
  Hardware hardware;
  double mfu = 0.4;  // efficiency of the compute, recomputation included (see the top)
  // What the search may vary; a key set here holds it at the config's value.
  bool fix_dp_replicate = false, fix_dp_shard = false, fix_cp = false, fix_tp = false;
  bool fix_pp = false, fix_ep = false, fix_etp = false, fix_local_batch = false, fix_ac = false;
  bool fix_schedule = false;
  // Activation checkpointing tried when not fixed: "none", "2" (every 2nd block), "op", "full".
  std::vector<std::string> ac_modes = {"none", "2", "op", "full"};
  // Pipeline schedules tried when not fixed.
  std::vector<std::string> schedules = {"1F1B", "Interleaved1F1B"};
  // Throws ConfigError naming the flag of a bad value (nodes, mfu, memory, ...).
  void validate() const;
};

struct Layout {
  int64_t dp_replicate = 1, dp_shard = 1, cp = 1, tp = 1, pp = 1, ep = 1;
  int64_t etp = 1;  // expert_tensor_parallel_degree: 1 (whole experts) or tp (each split over tp)
  std::string ac = "none";  // "none", "full", "op", or k (every k-th block)
  std::string schedule;     // pp > 1 only
  int64_t local_batch_size = 1;
  int64_t accumulation_steps = 1;
  int64_t world() const { return dp_replicate * dp_shard * cp * tp * pp; }
  // The degrees as ParallelDims takes them, and a layout of resolved degrees (dp_shard >= 1).
  ParallelDegrees degrees() const;
  static Layout of(const ParallelDegrees& d);
  // "dp_shard 8, tp 8, pp 8 Interleaved1F1B, AC full, local batch 32"; "ep 8, experts split
  // over tp" when etp = tp
  std::string describe() const;
  // `base` with this layout's parallelism, activation checkpointing and local batch.
  JobConfig apply(const JobConfig& base) const;
  // The command-line overrides that select it ("--parallelism.tensor_parallel_degree 8 ...").
  std::string overrides() const;
};

struct Collective {
  std::string dim;   // "fsdp", "hsdp", "ddp", "tp", "tp grads", "cp", "ep", "pp"
  double bytes = 0;  // per device per step
  double count = 0;  // collectives (or pipeline hops) per device per step
  bool inter_node = false;
  double seconds = 0;  // count x latency + bytes / the link's bandwidth
  double exposed = 0;  // what the step waits for
};

struct Prediction {
  Layout layout;
  MemoryEstimate memory;
  double usable_bytes = 0;  // memory_bytes - reserved_bytes
  double compute = 0;       // seconds per step
  double bubble = 0;
  std::vector<Collective> comm;
  double step = 0;
  double tokens_per_device = 0;  // tokens/s per device (TorchTitan's tps)
  double mfu = 0;                // useful FLOPs / (step * peak)
  double bubble_fraction = 0;    // of the pipeline's makespan (pp > 1)
  double exposed_comm() const;
  std::string reasoning;
};

// The fastest fitting layouts a Plan keeps (every one is counted), and the longest pipeline the
// search simulates (pp x 2 stages x microbatches; longer ones are counted as rejected).
constexpr size_t kMaxRanked = 1000;
constexpr int64_t kMaxPlannedPipelinePairs = int64_t{1} << 16;

struct Plan {
  std::vector<Prediction> ranked;  // fastest first (fitting layouts only), at most kMaxRanked
  int64_t fitting = 0;             // fitting layouts found (ranked holds the fastest of them)
  std::map<std::string, int64_t> rejected;  // reason -> count
  int64_t considered = 0;
  // The config's own layout (its degrees, dp_shard -1 resolved), when valid: where it ranks
  // (how many fitting layouts are faster; -1 when it does not fit) and its prediction.
  std::optional<Prediction> config_layout;
  int64_t config_rank = -1;
  std::string config_rejection;  // why it is not in `ranked`, when it is not
};

// The reason a layout cannot run ("tp does not divide n_kv_heads", "does not fit", ...), or
// "" when the trainer would accept it. Fills `prediction` when it returns "" or "does not fit".
std::string evaluate_layout(const PlanRequest& request, const Layout& layout,
                            Prediction* prediction);

// Every candidate layout, evaluated and ranked.
Plan plan_layouts(const PlanRequest& request);

}  // namespace titan
