// The planner's cost model (see cost_model.h and the top of planner.h).
#include "titan/plan/cost_model.h"

#include "titan/common/check.h"
#include "titan/components/training_dtype.h"
#include "titan/models/registry.h"
#include "titan/plan/memory_estimate.h"
#include "titan/plan/memory_options.h"
#include "titan/plan/schedule_simulator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace titan {

double Prediction::exposed_comm() const {
  double sum = 0;
  for (const Collective& c : comm) sum += c.exposed;
  return sum;
}

namespace plan_internal {
namespace {

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

const char* const kFsdp = "fsdp";

}  // namespace

std::string fmt(const char* format, double a, double b, double c) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), format, a, b, c);
  return buf;
}

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
    f.moe_layers = moe_layer_count(args);
  }
  f.expert_params = static_cast<double>(routed_expert_params(spec, config.model.flavor));
  return f;
}

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

const pp::PipelineLayout* PipelineCache::layout(const JobConfig& config, int64_t n_layers,
                                                std::string* why) {
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

PipelineSim PipelineCache::simulate(const pp::PipelineLayout& layout, double recompute,
                                    double comm_units) {
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

}  // namespace plan_internal
}  // namespace titan
