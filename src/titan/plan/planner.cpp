// The layout planner (see planner.h): the hardware presets, the validity rules of a layout (the
// trainer's) and the search; the step-time cost model is cost_model.cpp.
#include "titan/plan/planner.h"

#include "titan/plan/cost_model.h"

#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/components/training_dtype.h"
#include "titan/distributed/parallel_dims.h"
#include "titan/models/registry.h"
#include "titan/parallel/activation_checkpoint.h"
#include "titan/plan/pipeline_split.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

namespace titan {
namespace {

using plan_internal::fmt;
using plan_internal::kGB;
using plan_internal::model_facts;
using plan_internal::ModelFacts;
using plan_internal::PipelineCache;
using plan_internal::predict_time;
using plan_internal::reasoning;
using plan_internal::recompute_share;

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

std::string ac_from_config(const ActivationCheckpointSection& ac) {
  if (ac.mode == "none" || ac.mode == "full") return ac.mode;
  return ac.selective_ac_option;
}

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
    throw ConfigError(message(flag, " '", name, "' is not a GPU preset",
                              suggestion(lower, gpu_preset_names(), "presets"),
                              ". HINT: or give --gpu_memory_gib and --peak_tflops"));
  }
  return h;
}

void PlanRequest::validate() const {
  const auto positive = [](const std::string& flag, double v) {
    if (!(v > 0) || !std::isfinite(v)) {
      throw ConfigError(message(flag, " must be a positive number, got ", fmt("%g", v)));
    }
  };
  if (nodes < 1) throw ConfigError(message("--nodes must be >= 1, got ", nodes));
  if (gpus_per_node < 1) {
    throw ConfigError(message("--gpus_per_node must be >= 1, got ", gpus_per_node));
  }
  if (nodes > kMaxPlanDevices || gpus_per_node > kMaxPlanDevices ||
      nodes * gpus_per_node > kMaxPlanDevices) {
    throw ConfigError(
        message("--nodes ", nodes, " x --gpus_per_node ", gpus_per_node, " = ",
                fmt("%.4g", static_cast<double>(nodes) * static_cast<double>(gpus_per_node)),
                " devices: titan plan plans at most ", kMaxPlanDevices,
                " devices (the largest clusters have about 10^5)"));
  }
  positive("--gpu_memory_gib", hardware.memory_bytes);
  if (!(hardware.reserved_bytes >= 0) || hardware.reserved_bytes >= hardware.memory_bytes) {
    throw ConfigError(message("--reserved_gib ", fmt("%g", hardware.reserved_bytes / (1 << 30)),
                              " must be >= 0 and below the device memory, ",
                              fmt("%g", hardware.memory_bytes / (1 << 30)),
                              " GiB (--gpu_memory_gib)"));
  }
  positive("--peak_tflops", hardware.peak_flops);
  positive("--intra_node_gbps", hardware.intra_node_bps);
  positive("--inter_node_gbps", hardware.inter_node_bps);
  if (!(mfu > 0 && mfu <= 1)) {
    throw ConfigError(message("--mfu is the compute efficiency, a fraction in (0, 1], got ",
                              fmt("%g", mfu), ". HINT: 0.4 is typical for bf16 training on H100"));
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
      throw ConfigError(
          message("--ac '", ac, "' is not none, full, op or a positive integer (", e.what(), ")"));
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
