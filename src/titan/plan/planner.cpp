// The layout planner (see planner.h): the hardware presets, the validity rules of a layout (the
// trainer's), the step-time cost model and the search.
#include "titan/plan/planner.h"

#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/components/training_dtype.h"
#include "titan/distributed/parallel_dims.h"
#include "titan/models/registry.h"
#include "titan/parallel/activation_checkpoint.h"
#include "titan/plan/pipeline_split.h"
#include "titan/plan/schedule_simulator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

namespace titan {
namespace {

constexpr double kGB = 1e9;

std::string fmt(const char* format, double a, double b = 0, double c = 0) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), format, a, b, c);
  return buf;
}

// The divisors of n in increasing order, in O(sqrt(n)) (worlds of a million devices).
std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> low, high;
  for (int64_t d = 1; d <= n / d; ++d) {
    if (n % d != 0) continue;
    low.push_back(d);
    if (d != n / d) high.push_back(n / d);
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

// What the planner needs of a model beyond ModelStats: the attention and MoE shapes the
// trainer's checks look at.
struct ModelFacts {
  ModelStats stats;  // at (1, seq_len) in the compute dtype
  int64_t n_kv_heads = 0;
  int64_t ffn_dim = 0;
  bool tied = false;
  int64_t num_experts = 0, top_k = 0, moe_layers = 0, expert_hidden = 0;
  double expert_params = 0;
};

ModelFacts model_facts(const JobConfig& config) {
  const ModelSpec& spec = get_model_spec(config.model.name);
  check_flavor(spec, config.model.flavor);
  ModelFacts f;
  f.stats = spec.describe(config.model.flavor, 1, config.training.seq_len,
                          training_compute_dtype(config.training));
  const nlohmann::json args =
      spec.resolve_args({{"name", config.model.name}, {"flavor", config.model.flavor}});
  f.n_kv_heads = args.value("n_kv_heads", f.stats.n_heads);  // MLA: one K/V per head
  f.ffn_dim = args.value("ffn_dim", int64_t{0});
  f.tied = args.value("tie_embeddings", false);
  if (args.contains("moe") && args["moe"].is_object()) {
    f.num_experts = args["moe"].value("num_experts", int64_t{0});
    f.top_k = args["moe"].value("top_k", int64_t{0});
    f.expert_hidden = args["moe"].value("hidden_dim", int64_t{0});
    f.moe_layers = f.stats.n_layers - args.value("n_dense_layers", int64_t{0});
  }
  f.expert_params = static_cast<double>(routed_expert_params(spec, config.model.flavor));
  return f;
}

// The share of the forward that activation checkpointing `ac` recomputes (see planner.h).
double recompute_share(const std::string& ac, const ModelFacts& m, int64_t seq_len) {
  if (ac == "none") return 0;
  if (ac == "full") return 1;
  if (ac == "op") {
    // Half of the matmuls' forward (2 FLOPs per weight and token) of a forward of fpt / 3.
    const double matmul = static_cast<double>(m.stats.active_params() - m.stats.n_embedding_params);
    return 3.0 * matmul / m.stats.flops_per_token(seq_len);
  }
  return 1.0 / static_cast<double>(std::stoll(ac));
}

std::string ac_from_config(const ActivationCheckpointSection& ac) {
  if (ac.mode == "none" || ac.mode == "full") return ac.mode;
  return ac.selective_ac_option;
}

// Bytes per element of a dtype name of the config ("bfloat16", "float32").
double dtype_size(const std::string& name) {
  return static_cast<double>(c10::elementSize(dtype_from_name(name)));
}

// Where the groups of a layout sit: mesh order pp, dp_replicate, dp_shard, cp, tp (innermost
// fastest); a group fits in a node when its span (size x the degrees inside it) does.
struct Links {
  const PlanRequest& request;
  bool crosses(int64_t span) const { return span > request.gpus_per_node; }
  double bandwidth(int64_t span) const {
    return crosses(span) ? request.hardware.inter_node_bps : request.hardware.intra_node_bps;
  }
};

struct PipelineSim {
  double makespan_no_comm = 0;  // units of one microbatch-stage forward
  double makespan = 0;          // with the send/recv latency
  double busy = 0;              // the busiest rank's compute
};

// The pipelines of one search, each validated and simulated once: validate_pipeline's layout (or
// why it refuses it) per (pp, schedule, local batch), and the schedule's simulations per
// (layout, recompute, hop latency), which layouts differing only in their data-parallel split
// share.
class PipelineCache {
 public:
  // The layout, or nullptr with the ConfigError's text in *why.
  const pp::PipelineLayout* layout(const JobConfig& config, int64_t n_layers, std::string* why) {
    const ParallelismSection& p = config.parallelism;
    const auto key = std::make_tuple(p.pipeline_parallel_degree, p.pipeline_parallel_schedule,
                                     config.training.local_batch_size);
    auto it = layouts_.find(key);
    if (it == layouts_.end()) {
      Entry e;
      try {
        e.layout = pp::validate_pipeline(p, n_layers, config.training.local_batch_size);
        e.layout->peak_microbatches =
            pipeline_peak_microbatches(e.layout->table, e.layout->stages_per_rank);
      } catch (const ConfigError& error) {
        e.rejection = error.what();
      }
      it = layouts_.emplace(key, std::move(e)).first;
    }
    if (!it->second.layout) {
      *why = it->second.rejection;
      return nullptr;
    }
    return &*it->second.layout;
  }

  // `layout` (from layout()) run with forward 1, backward 2 + recompute, and comm_units per hop.
  PipelineSim simulate(const pp::PipelineLayout& layout, double recompute, double comm_units) {
    const auto key = std::make_tuple(&layout, recompute, comm_units);
    const auto it = sims_.find(key);
    if (it != sims_.end()) return it->second;
    pp::ActionCosts costs;
    costs.forward = 1;
    costs.full_backward = 2 + recompute;
    costs.backward_input = 1 + recompute;
    costs.backward_weight = 1;
    PipelineSim sim;
    if (comm_units > 0) {
      sim = simulate(layout, recompute, 0);
      costs.comm = comm_units;
      sim.makespan = pp::simulate_schedule(layout.table, costs).makespan;
    } else {
      const pp::SimulationResult result = pp::simulate_schedule(layout.table, costs);
      sim.makespan_no_comm = result.makespan;
      sim.makespan = result.makespan;
      sim.busy = *std::max_element(result.busy.begin(), result.busy.end());
    }
    sims_.emplace(key, sim);
    return sim;
  }

 private:
  struct Entry {
    std::optional<pp::PipelineLayout> layout;
    std::string rejection;
  };
  std::map<std::tuple<int64_t, std::string, int64_t>, Entry> layouts_;
  std::map<std::tuple<const pp::PipelineLayout*, double, double>, PipelineSim> sims_;
};

// A cheap rule of the trainer that `layout` breaks, or "".
std::string structural_rejection(const PlanRequest& request, const ModelFacts& m, const Layout& l) {
  const int64_t seq = request.config.training.seq_len;
  if (l.tp > 1) {
    if (m.tied) return "tp with tied embeddings";
    if (l.tp > m.n_kv_heads) return "tp > n_kv_heads";
    if (m.stats.n_heads % l.tp != 0 || m.n_kv_heads % l.tp != 0) return "tp does not divide heads";
    if (m.stats.vocab_size % l.tp != 0 || m.stats.dim % l.tp != 0 ||
        (m.ffn_dim > 0 && m.ffn_dim % l.tp != 0)) {
      return "tp does not divide dim / ffn / vocab";
    }
    if (seq % l.tp != 0) return "seq_len not divisible by tp";
  }
  if (l.cp > 1 && seq % (2 * l.cp * l.tp) != 0) return "seq_len not divisible by 2 x cp x tp";
  if (l.etp > 1) {
    if (m.num_experts == 0) return "etp without MoE";
    if (l.etp != l.tp) return "etp neither 1 nor tp";
    if (m.expert_hidden % l.tp != 0) return "tp does not divide the experts' hidden dim";
  }
  if (l.ep > 1) {
    if (m.num_experts == 0) return "ep without MoE";
    if (m.num_experts % l.ep != 0) return "ep does not divide num_experts";
  }
  if (l.ep > 1 || l.etp > 1) {
    try {
      resolve_parallel_degrees(l.degrees(), l.world());
    } catch (const ConfigError&) {
      return l.etp > 1 ? "ep not a multiple of cp within dp_shard x cp (etp = tp)"
                       : "ep not a multiple of cp x tp within dp_shard x cp x tp";
    }
  }
  return "";
}

std::string pipeline_rejection(const std::string& what) {
  if (what.find("more pipeline stages than layers") != std::string::npos) {
    return "more pipeline stages than layers";
  }
  if (what.find("microbatch") != std::string::npos) return "too few microbatches for the schedule";
  return "pipeline split";
}

const char* const kFsdp = "fsdp";

}  // namespace

std::vector<std::string> gpu_preset_names() { return {"h100", "h200", "a100"}; }

Hardware gpu_preset(const std::string& name, const std::string& flag) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  Hardware h;
  // Datasheet dense bf16 peaks (TorchTitan's MFU table), NVLink per-direction bandwidth per GPU,
  // InfiniBand NDR 400 Gb/s (H100 / H200) or HDR 200 Gb/s (A100) per GPU. Reserved: the CUDA
  // context, NCCL's buffers and the caching allocator's fragmentation, a tenth of the memory.
  // A small NCCL collective takes some 20 us.
  constexpr double kNcclLatency = 20e-6;
  if (lower == "h100") {
    h = {"H100 SXM", 80 * kGiB, 8 * kGiB, 989e12, 450 * kGB, 50 * kGB, true, kNcclLatency};
  } else if (lower == "h200") {
    h = {"H200 SXM", 141 * kGiB, 14.1 * kGiB, 989e12, 450 * kGB, 50 * kGB, true, kNcclLatency};
  } else if (lower == "a100") {
    h = {"A100 SXM", 80 * kGiB, 8 * kGiB, 312e12, 300 * kGB, 25 * kGB, true, kNcclLatency};
  } else {
    throw ConfigError(flag + " '" + name + "' is not a GPU preset" +
                      suggestion(lower, gpu_preset_names(), "presets") +
                      ". HINT: or give --gpu_memory_gib and --peak_tflops");
  }
  return h;
}

void PlanRequest::validate() const {
  const auto positive = [](const std::string& flag, double v) {
    if (!(v > 0) || !std::isfinite(v)) {
      throw ConfigError(flag + " must be a positive number, got " + fmt("%g", v));
    }
  };
  if (nodes < 1) throw ConfigError("--nodes must be >= 1, got " + std::to_string(nodes));
  if (gpus_per_node < 1) {
    throw ConfigError("--gpus_per_node must be >= 1, got " + std::to_string(gpus_per_node));
  }
  if (nodes > kMaxPlanDevices || gpus_per_node > kMaxPlanDevices ||
      nodes * gpus_per_node > kMaxPlanDevices) {
    throw ConfigError("--nodes " + std::to_string(nodes) + " x --gpus_per_node " +
                      std::to_string(gpus_per_node) + " = " +
                      fmt("%.4g", static_cast<double>(nodes) * static_cast<double>(gpus_per_node)) +
                      " devices: titan plan plans at most " + std::to_string(kMaxPlanDevices) +
                      " devices (the largest clusters have about 10^5)");
  }
  positive("--gpu_memory_gib", hardware.memory_bytes);
  if (!(hardware.reserved_bytes >= 0) || hardware.reserved_bytes >= hardware.memory_bytes) {
    throw ConfigError("--reserved_gib " + fmt("%g", hardware.reserved_bytes / (1 << 30)) +
                      " must be >= 0 and below the device memory, " +
                      fmt("%g", hardware.memory_bytes / (1 << 30)) + " GiB (--gpu_memory_gib)");
  }
  positive("--peak_tflops", hardware.peak_flops);
  positive("--intra_node_gbps", hardware.intra_node_bps);
  positive("--inter_node_gbps", hardware.inter_node_bps);
  if (!(mfu > 0 && mfu <= 1)) {
    throw ConfigError("--mfu is the compute efficiency, a fraction in (0, 1], got " +
                      fmt("%g", mfu) + ". HINT: 0.4 is typical for bf16 training on H100");
  }
  if (config.training.global_batch_size == 0 || config.training.global_batch_size < -1) {
    throw ConfigError("training.global_batch_size must be > 0 (or -1: local_batch_size x dp)");
  }
  if (ac_modes.empty()) throw ConfigError("--ac needs at least one mode");
  for (const std::string& ac : ac_modes) {
    ActivationCheckpointSection section;
    section.mode = ac == "none" || ac == "full" ? ac : "selective";
    section.selective_ac_option = ac;
    try {
      ac_policy(section);
    } catch (const ConfigError& e) {
      throw ConfigError("--ac '" + ac + "' is not none, full, op or a positive integer (" +
                        e.what() + ")");
    }
  }
  for (const std::string& s : schedules) pp::parse_schedule_kind(s, "--pp_schedules");
}

ParallelDegrees Layout::degrees() const {
  return {.dp_replicate = dp_replicate,
          .dp_shard = dp_shard,
          .cp = cp,
          .tp = tp,
          .pp = pp,
          .ep = ep,
          .etp = etp};
}

Layout Layout::of(const ParallelDegrees& d) {
  Layout l;
  l.dp_replicate = d.dp_replicate;
  l.dp_shard = d.dp_shard;
  l.cp = d.cp;
  l.tp = d.tp;
  l.pp = d.pp;
  l.ep = d.ep;
  l.etp = d.etp;
  return l;
}

std::string Layout::describe() const {
  std::vector<std::string> parts;
  if (dp_replicate > 1) parts.push_back("dp_replicate " + std::to_string(dp_replicate));
  if (dp_shard > 1) parts.push_back("dp_shard " + std::to_string(dp_shard));
  if (cp > 1) parts.push_back("cp " + std::to_string(cp));
  if (tp > 1) parts.push_back("tp " + std::to_string(tp));
  if (pp > 1) parts.push_back("pp " + std::to_string(pp) + " " + schedule);
  if (ep > 1) parts.push_back("ep " + std::to_string(ep));
  if (etp > 1) parts.push_back("experts split over tp");
  if (parts.empty()) parts.push_back("1 device");
  const std::string ac_text = ac == "none" || ac == "full" || ac == "op" ? ac : "every " + ac;
  return join(parts) + ", AC " + ac_text + ", local batch " + std::to_string(local_batch_size) +
         (accumulation_steps > 1 ? " x " + std::to_string(accumulation_steps) + " accumulation"
                                 : "");
}

JobConfig Layout::apply(const JobConfig& base) const {
  JobConfig c = base;
  ParallelismSection& p = c.parallelism;
  p.data_parallel_replicate_degree = dp_replicate;
  p.data_parallel_shard_degree = dp_shard;
  p.context_parallel_degree = cp;
  p.tensor_parallel_degree = tp;
  p.pipeline_parallel_degree = pp;
  p.expert_parallel_degree = ep;
  p.expert_tensor_parallel_degree = etp;
  if (pp > 1) p.pipeline_parallel_schedule = schedule;
  c.training.local_batch_size = local_batch_size;
  ActivationCheckpointSection& a = c.activation_checkpoint;
  a.mode = ac == "none" || ac == "full" ? ac : "selective";
  if (a.mode == "selective") a.selective_ac_option = ac;
  return c;
}

std::string Layout::overrides() const {
  std::string s = "--parallelism.data_parallel_replicate_degree " + std::to_string(dp_replicate) +
                  " --parallelism.data_parallel_shard_degree " + std::to_string(dp_shard) +
                  " --parallelism.context_parallel_degree " + std::to_string(cp) +
                  " --parallelism.tensor_parallel_degree " + std::to_string(tp) +
                  " --parallelism.pipeline_parallel_degree " + std::to_string(pp);
  if (pp > 1) s += " --parallelism.pipeline_parallel_schedule " + schedule;
  if (ep > 1) s += " --parallelism.expert_parallel_degree " + std::to_string(ep);
  if (ep > 1 || etp > 1) {
    s += " --parallelism.expert_tensor_parallel_degree " + std::to_string(etp);
  }
  s += " --training.local_batch_size " + std::to_string(local_batch_size);
  if (ac == "none" || ac == "full") {
    s += " --activation_checkpoint.mode " + ac;
  } else {
    s +=
        " --activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option " + ac;
  }
  return s;
}

double Prediction::exposed_comm() const {
  double sum = 0;
  for (const Collective& c : comm) sum += c.exposed;
  return sum;
}

namespace {

// The step time of a valid layout (see the cost model in planner.h), into `out`.
void predict_time(const PlanRequest& request, const ModelFacts& m, const Layout& l,
                  const pp::PipelineLayout* pipeline, PipelineCache& pipelines, Prediction& out) {
  const JobConfig& config = request.config;
  const Hardware& hw = request.hardware;
  const Links links{request};
  const double T = static_cast<double>(config.training.seq_len);
  const double W = static_cast<double>(l.world());
  const double G =
      static_cast<double>(l.local_batch_size * l.accumulation_steps * l.dp_replicate * l.dp_shard);
  const double a = static_cast<double>(l.accumulation_steps);
  const double L = static_cast<double>(m.stats.n_layers);
  const double dim = static_cast<double>(m.stats.dim);
  const double cb = static_cast<double>(c10::elementSize(training_compute_dtype(config.training)));
  const double fpt = m.stats.flops_per_token(config.training.seq_len);
  const double r = recompute_share(l.ac, m, config.training.seq_len);

  const double useful = fpt * G * T / W;  // FLOPs per device per step
  const double compute_acc = useful * (1 + r / 3) / (hw.peak_flops * request.mfu) / a;
  // Sequences per forward-backward (all microbatches of a pipeline run).
  const double seqs = static_cast<double>(l.local_batch_size);
  const double layers = L / static_cast<double>(l.pp);  // per pp rank

  // Critical-path collectives per forward-backward.
  std::vector<Collective> comm;
  // Forward-backwards (microbatches under PP) per accumulation step.
  const double runs = pipeline != nullptr ? static_cast<double>(pipeline->n_microbatches) : 1.0;
  const auto add = [&](const std::string& dim_name, double bytes, double count, int64_t span,
                       bool hidden) {
    Collective c;
    c.dim = dim_name;
    c.bytes = bytes;
    c.count = count;
    c.inter_node = links.crosses(span);
    c.seconds = count * hw.latency_s + bytes / links.bandwidth(span);
    c.exposed = hidden ? 0 : c.seconds;
    comm.push_back(c);
  };
  const double tpf = static_cast<double>(l.tp - 1) / static_cast<double>(l.tp);
  // MoE blocks on this pp rank.
  const double moe_layers = static_cast<double>(m.moe_layers) / static_cast<double>(l.pp);
  if (l.tp > 1) {
    const double x = seqs * T / static_cast<double>(l.cp) * dim * cb;
    // Experts kept whole (etp 1) run on the sequence shard: no gather around the MoE.
    const double whole_expert_blocks = l.etp == 1 ? moe_layers : 0;
    const double per_run =
        (8 + 4 * r) * layers - (4 + 2 * r) * whole_expert_blocks + 4.0 / static_cast<double>(l.pp);
    add("tp", a * per_run * x * tpf, a * runs * per_run, l.tp, false);
  }
  if (l.cp > 1) {
    const double chunk = seqs * T / static_cast<double>(l.cp) * 2.0 *
                         static_cast<double>(m.n_kv_heads) / static_cast<double>(l.tp) *
                         static_cast<double>(m.stats.head_dim) * cb;
    const double per_run = (3 + r) * layers * static_cast<double>(l.cp - 1);
    add("cp", a * per_run * chunk, a * runs * per_run, l.cp * l.tp, false);
  }
  if (l.ep > 1) {
    // Each rank routes its sequence shard, or with etp = tp every tp rank the whole sequences.
    const double tokens = seqs * T / static_cast<double>(l.cp * (l.etp > 1 ? 1 : l.tp));
    add("ep",
        a * (4 + 2 * r) * moe_layers * tokens * static_cast<double>(m.top_k) * dim * cb *
            static_cast<double>(l.ep - 1) / static_cast<double>(l.ep),
        a * runs * (4 + 2 * r) * moe_layers, l.ep, false);
  }
  double critical_acc = compute_acc;
  for (const Collective& c : comm) critical_acc += c.seconds / a;

  // Data-parallel collectives: hidden behind compute on a GPU.
  const ParallelismSection& p = config.parallelism;
  const double param_bytes = dtype_size(config.training.mixed_precision_param);
  const double reduce_bytes = dtype_size(config.training.mixed_precision_reduce);
  const int64_t fsdp = l.dp_shard * l.cp;
  const double pp_d = static_cast<double>(l.pp);
  const double dense_local = (static_cast<double>(m.stats.n_params) - m.expert_params) /
                             (static_cast<double>(l.tp) * pp_d);
  // The routed experts this rank holds before FSDP (its ep share, split over tp with etp = tp),
  // and the group FSDP shards them over (dp_shard_mod_ep under ep).
  const double expert_local = m.expert_params / (static_cast<double>(l.ep * l.etp) * pp_d);
  const int64_t expert_fsdp =
      l.ep > 1 ? ParallelDims::planned(l.degrees(), l.world()).dp_shard_mod_ep() : fsdp;
  // titan's FSDP reshards after forward (and gathers again for backward) unless "never", which
  // is also what "default" means under PP (parallelized_model.cpp): one gather per microbatch.
  const bool keeps = p.fsdp_reshard_after_forward == "never" ||
                     (l.pp > 1 && p.fsdp_reshard_after_forward == "default");
  const double gathers = keeps ? 1 : 2;
  const double passes = a * runs;
  const double units = layers + 2;  // blocks, embedding, output
  const int64_t dp_span = l.dp_shard * l.cp * l.tp;
  const size_t first_dp = comm.size();
  const auto ring = [](int64_t n) { return static_cast<double>(n - 1) / static_cast<double>(n); };
  if (fsdp > 1 || expert_fsdp > 1) {
    double bytes = 0;
    if (fsdp > 1) bytes += (gathers * param_bytes + reduce_bytes) * dense_local * ring(fsdp);
    if (expert_fsdp > 1) {
      bytes += (gathers * param_bytes + reduce_bytes) * expert_local * ring(expert_fsdp);
    }
    add(kFsdp, passes * bytes, passes * units * (gathers + 1), dp_span, true);
  }
  if (l.dp_replicate > 1) {
    const double shard = dense_local / static_cast<double>(std::max<int64_t>(1, fsdp)) +
                         expert_local / static_cast<double>(std::max<int64_t>(1, expert_fsdp));
    add(fsdp > 1 ? "hsdp" : "ddp", passes * 2 * reduce_bytes * shard * ring(l.dp_replicate),
        passes * units, l.dp_replicate * dp_span, true);
  }
  double dp_total = 0;
  for (size_t i = first_dp; i < comm.size(); ++i) dp_total += comm[i].seconds;

  // The pipeline: the schedule simulated with one microbatch-stage's share of the critical path
  // as its unit.
  double run = critical_acc;  // seconds per forward-backward
  if (pipeline != nullptr) {
    const double units_per_run = static_cast<double>(pipeline->n_microbatches) *
                                 static_cast<double>(pipeline->stages_per_rank) * (3 + r);
    const double unit = critical_acc / units_per_run;
    const double hop = static_cast<double>(pipeline->microbatch_size) * T /
                       static_cast<double>(l.cp) * dim * cb / static_cast<double>(l.tp);
    const int64_t pp_span = l.world();
    const double hop_s = hw.latency_s + hop / links.bandwidth(pp_span);
    const PipelineSim sim = pipelines.simulate(*pipeline, r, hop_s / unit);
    out.bubble = a * (sim.makespan_no_comm - sim.busy) * unit;
    out.bubble_fraction = (sim.makespan_no_comm - sim.busy) / sim.makespan_no_comm;
    // Every stage boundary a rank owns, forward and backward, per microbatch.
    const double hops = 2.0 * static_cast<double>(pipeline->n_microbatches) *
                        static_cast<double>(pipeline->stages_per_rank);
    Collective c;
    c.dim = "pp";
    c.bytes = a * hops * hop;
    c.count = a * hops;
    c.inter_node = links.crosses(pp_span);
    c.seconds = a * hops * hop_s;
    c.exposed = a * (sim.makespan - sim.makespan_no_comm) * unit;
    comm.push_back(c);
    run = sim.makespan * unit;
  }
  out.compute = a * compute_acc;
  // Exposed data-parallel time: all of it on a CPU; on a GPU what the compute cannot hide, at
  // least one unit's share (the first all-gather, the last reduce-scatter).
  double dp_exposed = dp_total;
  if (hw.comm_overlaps_compute) {
    dp_exposed = std::max(dp_total - out.compute, dp_total / units);
  }
  for (size_t i = first_dp; i < comm.size() && comm[i].dim != "pp"; ++i) {
    comm[i].exposed = dp_total > 0 ? dp_exposed * comm[i].seconds / dp_total : 0;
  }
  // Whole experts replicated over tp (no ep, etp 1): their FSDP-sharded gradients are partial
  // sums, all-reduced over tp in float32 once per step, after the backward.
  double tail = 0;
  if (l.tp > 1 && l.ep == 1 && l.etp == 1 && m.expert_params > 0) {
    const double grads = expert_local / static_cast<double>(std::max<int64_t>(1, fsdp));
    add("tp grads", 2 * 4 * grads * tpf, 1, l.tp, false);
    tail = comm.back().seconds;
  }
  out.comm = comm;
  out.step = a * run + dp_exposed + tail;
  out.tokens_per_device = G * T / W / out.step;
  out.mfu = useful / (out.step * hw.peak_flops);
}

std::string reasoning(const Prediction& p) {
  std::string biggest = "none";
  double most = 0;
  if (p.bubble > most) {
    most = p.bubble;
    biggest = "pipeline bubble";
  }
  for (const Collective& c : p.comm) {
    if (c.exposed > most) {
      most = c.exposed;
      biggest = c.dim + (c.inter_node ? " (inter-node)" : " (intra-node)");
    }
  }
  std::string why = fmt("%.0f%% of the step computes", 100 * p.compute / p.step);
  if (most > 0) why += "; largest overhead " + biggest + fmt(" %.3g s", most);
  for (const Collective& c : p.comm) {
    if (c.dim != "tp" && c.dim != "cp" && c.dim != "ep" && c.dim != "pp" &&
        c.exposed < 0.5 * c.seconds) {
      why += "; " + c.dim + fmt(" traffic (%.3g GB) hides behind compute", c.bytes / kGB);
      break;
    }
  }
  why += fmt("; %.0f%% of usable memory", 100 * p.memory.total() / p.usable_bytes);
  return why;
}

}  // namespace

namespace {

// `time_if_unfit`: predict the step time of a layout that does not fit too (the config's own,
// which is shown either way); the search skips that work.
std::string evaluate(const PlanRequest& request, const ModelFacts& m, const Layout& layout,
                     PipelineCache& pipelines, Prediction* prediction, bool time_if_unfit = true) {
  std::string reason = structural_rejection(request, m, layout);
  if (!reason.empty()) return reason;
  const JobConfig config = layout.apply(request.config);
  const pp::PipelineLayout* pipeline = nullptr;
  if (layout.pp > 1) {
    std::string why;
    pipeline = pipelines.layout(config, m.stats.n_layers, &why);
    if (pipeline == nullptr) return pipeline_rejection(why);
  }
  const MemoryOptions options =
      training_memory_options(config, layout.world() / layout.dp_replicate, pipeline);
  Prediction p;
  p.layout = layout;
  p.memory = estimate_training_memory(get_model_spec(config.model.name), config.model.flavor,
                                      layout.local_batch_size, config.training.seq_len,
                                      training_compute_dtype(config.training), options);
  p.usable_bytes = request.hardware.memory_bytes - request.hardware.reserved_bytes;
  const bool fits = p.memory.total() <= p.usable_bytes;
  if (!fits && !time_if_unfit) return "does not fit";
  predict_time(request, m, layout, pipeline, pipelines, p);
  p.reasoning = reasoning(p);
  if (prediction != nullptr) *prediction = std::move(p);
  return fits ? "" : "does not fit";
}

}  // namespace

std::string evaluate_layout(const PlanRequest& request, const Layout& layout,
                            Prediction* prediction) {
  PipelineCache pipelines;
  return evaluate(request, model_facts(request.config), layout, pipelines, prediction);
}

namespace {

// The config's own layout on the request's world (dp_shard -1 takes the rest), or nullopt with
// the reason when the degrees do not multiply to it.
std::optional<Layout> config_layout(const PlanRequest& request, int64_t global, std::string* why) {
  const JobConfig& c = request.config;
  ParallelDegrees d = ParallelDegrees::from_config(c.parallelism);
  try {
    d = resolve_parallel_degrees(d, request.nodes * request.gpus_per_node);
  } catch (const ConfigError& e) {
    *why = e.what();
    return std::nullopt;
  }
  Layout l = Layout::of(d);
  l.schedule = c.parallelism.pipeline_parallel_schedule;
  l.ac = ac_from_config(c.activation_checkpoint);
  l.local_batch_size = c.training.local_batch_size;
  const int64_t per_step = l.local_batch_size * l.dp_replicate * l.dp_shard;
  if (global % per_step != 0) {
    *why = "training.global_batch_size " + std::to_string(global) +
           " is not a multiple of local_batch_size x dp = " + std::to_string(per_step);
    return std::nullopt;
  }
  l.accumulation_steps = global / per_step;
  return l;
}

}  // namespace

namespace {

// Sorts `ranked` fastest first (less memory first on a tie) and keeps the first `keep`.
void keep_fastest(std::vector<Prediction>& ranked, size_t keep) {
  const auto faster = [](const Prediction& x, const Prediction& y) {
    if (x.step != y.step) return x.step < y.step;
    return x.memory.total() < y.memory.total();
  };
  if (ranked.size() > keep) {
    std::nth_element(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(keep),
                     ranked.end(), faster);
    ranked.resize(keep);
  }
  std::sort(ranked.begin(), ranked.end(), faster);
}

}  // namespace

Plan plan_layouts(const PlanRequest& request) {
  request.validate();
  const ModelFacts m = model_facts(request.config);
  const JobConfig& c = request.config;
  const ParallelismSection& p = c.parallelism;
  const int64_t world = request.nodes * request.gpus_per_node;
  Plan plan;

  int64_t global = c.training.global_batch_size;
  std::string why;
  if (global < 0) {
    // -1: one local batch per data-parallel rank of the config's own layout.
    ParallelDegrees d = ParallelDegrees::from_config(p);
    d = resolve_parallel_degrees(d, world);
    global = c.training.local_batch_size * d.dp_replicate * d.dp_shard;
  }

  const auto choices = [](bool fixed, int64_t value, int64_t limit) {
    if (fixed) return limit % value == 0 ? std::vector<int64_t>{value} : std::vector<int64_t>{};
    return divisors(limit);
  };
  std::vector<std::string> acs = request.ac_modes;
  if (request.fix_ac) acs = {ac_from_config(c.activation_checkpoint)};
  // By the share of the forward each recomputes (the step time grows with it).
  std::stable_sort(acs.begin(), acs.end(), [&](const std::string& a, const std::string& b) {
    return recompute_share(a, m, c.training.seq_len) < recompute_share(b, m, c.training.seq_len);
  });
  std::vector<std::string> schedules = request.schedules;
  if (request.fix_schedule) schedules = {p.pipeline_parallel_schedule};

  PipelineCache pipelines;
  std::set<std::string> unfit;        // layouts (without AC) that did not fit, per AC mode
  std::vector<Prediction> fitting;    // the fastest so far (at most 2 x kMaxRanked)
  std::vector<double> fitting_steps;  // every fitting layout's step time, for the config's rank
  for (int64_t pp_deg : choices(request.fix_pp, p.pipeline_parallel_degree, world)) {
    // Tensor parallelism stays within a node unless fixed: its per-layer all-reduces across the
    // inter-node links would dominate any step (and the search grows with every degree tried).
    std::vector<int64_t> tps = choices(request.fix_tp, p.tensor_parallel_degree, world / pp_deg);
    if (!request.fix_tp) {
      tps.erase(std::remove_if(tps.begin(), tps.end(),
                               [&](int64_t tp) { return tp > request.gpus_per_node; }),
                tps.end());
    }
    for (int64_t tp : tps) {
      for (int64_t cp : choices(request.fix_cp, p.context_parallel_degree, world / pp_deg / tp)) {
        const int64_t rest = world / pp_deg / tp / cp;
        for (int64_t rep :
             choices(request.fix_dp_replicate, p.data_parallel_replicate_degree, rest)) {
          const int64_t shard = rest / rep;
          if (request.fix_dp_shard && p.data_parallel_shard_degree > 0 &&
              shard != p.data_parallel_shard_degree) {
            continue;
          }
          // Experts whole (etp 1) or split over tp (etp = tp); ep borrows cp x tp (etp 1) or
          // cp (etp = tp) and part of dp_shard.
          std::vector<std::pair<int64_t, int64_t>> expert_layouts;  // (ep, etp)
          std::vector<int64_t> etps = {1};
          if (request.fix_etp) {
            etps = {p.expert_tensor_parallel_degree};
          } else if (m.num_experts > 0 && tp > 1) {
            etps.push_back(tp);
          }
          for (int64_t etp : etps) {
            if (request.fix_ep) {
              expert_layouts.emplace_back(p.expert_parallel_degree, etp);
              continue;
            }
            expert_layouts.emplace_back(1, etp);
            if (m.num_experts == 0) continue;
            const int64_t borrowed = etp > 1 ? cp : cp * tp;
            for (int64_t k : divisors(shard)) {
              if (k * borrowed > 1) expert_layouts.emplace_back(k * borrowed, etp);
            }
          }
          const int64_t dp = rep * shard;
          for (const auto& [ep, etp] : expert_layouts) {
            for (const std::string& schedule :
                 pp_deg > 1 ? schedules : std::vector<std::string>{""}) {
              Layout l = Layout::of({.dp_replicate = rep,
                                     .dp_shard = shard,
                                     .cp = cp,
                                     .tp = tp,
                                     .pp = pp_deg,
                                     .ep = ep,
                                     .etp = etp});
              l.schedule = schedule;
              if (global % dp != 0) {
                plan.considered += static_cast<int64_t>(acs.size());
                plan.rejected["global batch not divisible by dp"] +=
                    static_cast<int64_t>(acs.size());
                continue;
              }
              for (int64_t lb :
                   choices(request.fix_local_batch, c.training.local_batch_size, global / dp)) {
                l.local_batch_size = lb;
                l.accumulation_steps = global / dp / lb;
                // Lightest checkpointing first: once one fits, the heavier ones only recompute
                // more on the same layout (slower, never ranked above it) and are not timed.
                // A pipeline of more (stage, microbatch) pairs than this is not simulated: its
                // table alone would take seconds and megabytes, for every such layout.
                const int64_t mbs = std::max<int64_t>(1, p.pipeline_parallel_microbatch_size);
                if (pp_deg > 1 && 2 * pp_deg * (lb / mbs) > kMaxPlannedPipelinePairs) {
                  plan.considered += static_cast<int64_t>(acs.size());
                  plan.rejected["pipeline of more than " +
                                std::to_string(kMaxPlannedPipelinePairs) +
                                " stage x microbatch pairs"] += static_cast<int64_t>(acs.size());
                  continue;
                }
                bool fitted = false;
                for (const std::string& ac : acs) {
                  ++plan.considered;
                  if (fitted) {
                    ++plan.rejected["slower than a lighter AC that fits"];
                    continue;
                  }
                  l.ac = ac;
                  Prediction pred;
                  const std::string reason =
                      evaluate(request, m, l, pipelines, &pred, /*time_if_unfit=*/false);
                  if (!reason.empty()) {
                    ++plan.rejected[reason];
                    if (reason == "does not fit") {
                      Layout key = l;
                      key.ac = "";
                      unfit.insert(key.overrides() + " ac " + ac);
                    }
                    continue;
                  }
                  fitted = true;
                  ++plan.fitting;
                  fitting_steps.push_back(pred.step);
                  fitting.push_back(std::move(pred));
                  if (fitting.size() >= 2 * kMaxRanked) keep_fastest(fitting, kMaxRanked);
                }
              }
            }
          }
        }
      }
    }
  }
  keep_fastest(fitting, kMaxRanked);
  // Say when a lighter checkpointing of the same layout did not fit.
  const std::vector<std::string> lighter = {"none", "2", "op", "full"};
  for (Prediction& pred : fitting) {
    Layout key = pred.layout;
    key.ac = "";
    for (const std::string& ac : lighter) {
      if (ac == pred.layout.ac) break;
      if (unfit.count(key.overrides() + " ac " + ac)) {
        pred.reasoning += "; AC " + ac + " would not fit";
        break;
      }
    }
  }
  plan.ranked = std::move(fitting);

  if (const std::optional<Layout> own = config_layout(request, global, &why)) {
    Prediction pred;
    const std::string reason = evaluate(request, m, *own, pipelines, &pred);
    if (reason.empty() || reason == "does not fit") plan.config_layout = pred;
    plan.config_rejection = reason;
    if (reason.empty()) {
      // Its place among the ranked layouts (it may lie outside the searched modes).
      plan.config_rank = std::count_if(fitting_steps.begin(), fitting_steps.end(),
                                       [&](double step) { return step < pred.step; });
    }
  } else {
    plan.config_rejection = why;
  }
  return plan;
}

}  // namespace titan
