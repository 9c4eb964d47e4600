// The layout planner: every ranked layout obeys the trainer's rules (degrees multiply to the
// world and pass its checks, batches divide, pipelines split) and fits; its memory is
// estimate_training_memory with the options written out here by hand (the estimate `titan
// inspect` and `titan train` use); compute follows the MFU formula; more nodes are not slower
// when compute-bound; a slower inter-node link slows layouts whose groups cross nodes and only
// those; the bubble is the schedule simulator's; bad requests name their flag.
#include "../test_util.h"
#include "titan/common/check.h"
#include "titan/components/training_dtype.h"
#include "titan/distributed/parallel_dims.h"
#include "titan/models/registry.h"
#include "titan/plan/pipeline_split.h"
#include "titan/plan/planner.h"
#include "titan/plan/schedule_simulator.h"

#include <gtest/gtest.h>

namespace titan {
namespace test_planner {

using test::contains;
using test::message_of;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

PlanRequest request_for(const std::string& flavor, int64_t seq_len, int64_t global_batch,
                        int64_t nodes, int64_t gpus_per_node) {
  PlanRequest r;
  r.config.model.name = "llama3";
  r.config.model.flavor = flavor;
  r.config.training.seq_len = seq_len;
  r.config.training.global_batch_size = global_batch;
  r.config.training.local_batch_size = 1;
  r.config.training.mixed_precision_param = "bfloat16";
  r.nodes = nodes;
  r.gpus_per_node = gpus_per_node;
  r.hardware = gpu_preset("h100");
  return r;
}

double step_of(const PlanRequest& r, const Layout& l) {
  Prediction p;
  const std::string reason = evaluate_layout(r, l, &p);
  EXPECT_EQ(reason, "") << l.describe();
  return p.step;
}

TEST(Planner, EveryRankedLayoutIsOneTheTrainerAccepts) {
  // One node of 16 (tensor parallelism stays within a node, so tp 16 is tried).
  const PlanRequest r = request_for("8B", 8192, 32, /*nodes=*/1, /*gpus_per_node=*/16);
  const Plan plan = plan_layouts(r);
  ASSERT_FALSE(plan.ranked.empty());
  int64_t rejected = 0;
  for (const auto& [reason, n] : plan.rejected) rejected += n;
  EXPECT_EQ(rejected + plan.fitting, plan.considered);
  EXPECT_EQ(static_cast<int64_t>(plan.ranked.size()),
            std::min<int64_t>(plan.fitting, static_cast<int64_t>(kMaxRanked)));
  EXPECT_GT(plan.rejected.at("tp > n_kv_heads"), 0);  // 8B has 8 KV heads; tp 16 exists
  EXPECT_GT(plan.rejected.at("does not fit"), 0);
  const ModelStats s = get_model_spec("llama3").describe("8B", 1, 8192, at::kBFloat16);
  bool saw_pp = false, saw_tp = false, saw_accumulation = false;
  for (const Prediction& p : plan.ranked) {
    const Layout& l = p.layout;
    SCOPED_TRACE(l.describe());
    EXPECT_EQ(l.world(), 16);
    EXPECT_NO_THROW(resolve_parallel_degrees(l.degrees(), 16));
    EXPECT_EQ(s.n_heads % l.tp, 0);
    EXPECT_EQ(8 % l.tp, 0);  // n_kv_heads
    EXPECT_EQ(8192 % (l.tp * (l.cp > 1 ? 2 * l.cp : 1)), 0);
    EXPECT_EQ(l.local_batch_size * l.accumulation_steps * l.dp_replicate * l.dp_shard, 32);
    if (l.pp > 1) {
      const JobConfig c = l.apply(r.config);
      EXPECT_NO_THROW(pp::validate_pipeline(c.parallelism, s.n_layers, l.local_batch_size));
      saw_pp = true;
    }
    saw_tp |= l.tp > 1;
    saw_accumulation |= l.accumulation_steps > 1;
    EXPECT_LE(p.memory.total(), p.usable_bytes);
    EXPECT_GT(p.tokens_per_device, 0);
  }
  EXPECT_TRUE(saw_pp && saw_tp && saw_accumulation);
  for (size_t i = 1; i < plan.ranked.size(); ++i) {
    EXPECT_LE(plan.ranked[i - 1].step, plan.ranked[i].step);
  }
}

// The "never disagree" property: the planner's memory is estimate_training_memory with the
// sharding written out here from the layout alone (1F1B's first stage holds pp microbatches).
TEST(Planner, MemoryIsTheTrainersEstimate) {
  const PlanRequest r = request_for("8B", 8192, 64, 2, 8);
  const ModelSpec& spec = get_model_spec("llama3");
  int64_t checked = 0;
  for (const Prediction& p : plan_layouts(r).ranked) {
    const Layout& l = p.layout;
    SCOPED_TRACE(l.describe());
    if (l.pp > 1 && l.schedule != "1F1B") continue;
    MemoryOptions o;
    o.param_shards = l.world() / l.dp_replicate;
    o.activation_shards = l.tp * l.pp;
    o.sequence_shards = l.cp;
    o.ac_every = l.ac == "full" ? 1 : (l.ac == "none" || l.ac == "op" ? 0 : std::stoll(l.ac));
    o.ac_per_op = l.ac == "op";
    if (l.pp > 1) o.pipeline_sequences_in_flight = std::min(l.pp, l.local_batch_size);
    // Under PP, FSDP keeps the stage's units gathered between microbatches.
    o.fsdp_keeps_gathered = l.pp > 1;
    const MemoryEstimate e =
        estimate_training_memory(spec, "8B", l.local_batch_size, 8192, at::kBFloat16, o);
    ASSERT_EQ(e.parts.size(), p.memory.parts.size());
    for (size_t i = 0; i < e.parts.size(); ++i) {
      EXPECT_EQ(e.parts[i].name, p.memory.parts[i].name);
      EXPECT_DOUBLE_EQ(e.parts[i].bytes, p.memory.parts[i].bytes) << e.parts[i].name;
    }
    ++checked;
  }
  EXPECT_GT(checked, 20);
}

TEST(Planner, PipelineStagesHoldTheirMicrobatchesInFlight) {
  const auto peak = [](pp::ScheduleKind kind, int64_t pp_deg, int64_t v, int64_t m) {
    return pipeline_peak_microbatches(pp::generate_schedule(kind, {pp_deg, v, m}), v);
  };
  EXPECT_DOUBLE_EQ(peak(pp::ScheduleKind::k1F1B, 4, 1, 8), 4);
  EXPECT_DOUBLE_EQ(peak(pp::ScheduleKind::kGPipe, 4, 1, 8), 8);
  // Interleaving holds more microbatches, each over half the rank's layers.
  const double interleaved = peak(pp::ScheduleKind::kInterleaved1F1B, 4, 2, 8);
  EXPECT_GT(interleaved, 4);
  EXPECT_LT(interleaved, 8);
  // The estimate keeps those sequences' activations, not the whole batch's.
  JobConfig c;
  c.model.flavor = "debugmodel";
  c.training.local_batch_size = 8;
  c.parallelism.pipeline_parallel_degree = 4;
  c.parallelism.pipeline_parallel_schedule = "GPipe";
  c.activation_checkpoint.mode = "none";
  EXPECT_DOUBLE_EQ(training_memory_options(c, 4).pipeline_sequences_in_flight, 8);
  c.parallelism.pipeline_parallel_schedule = "1F1B";
  const MemoryOptions one_f_one_b = training_memory_options(c, 4);
  EXPECT_DOUBLE_EQ(one_f_one_b.pipeline_sequences_in_flight, 4);
  const ModelSpec& spec = get_model_spec("llama3");
  MemoryOptions whole = one_f_one_b;
  whole.pipeline_sequences_in_flight = 0;
  EXPECT_LT(estimate_training_memory(spec, "debugmodel", 8, 256, at::kFloat, one_f_one_b).total(),
            estimate_training_memory(spec, "debugmodel", 8, 256, at::kFloat, whole).total());
}

// One device: the step is the MFU formula's compute, recomputation included.
TEST(Planner, ComputeIsTheMfuFormula) {
  PlanRequest r = request_for("1B", 2048, 4, 1, 1);
  r.hardware.memory_bytes = 1e6 * kGiB;
  Layout l;
  l.dp_shard = 1;
  l.local_batch_size = 4;
  const ModelStats s = get_model_spec("llama3").describe("1B", 1, 2048, at::kBFloat16);
  const double useful = s.flops_per_token(2048) * 4 * 2048;
  Prediction p;
  ASSERT_EQ(evaluate_layout(r, l, &p), "");
  EXPECT_NEAR(p.step, useful / (r.hardware.peak_flops * r.mfu), 1e-12 * p.step);
  EXPECT_NEAR(p.mfu, r.mfu, 1e-12);
  EXPECT_TRUE(p.comm.empty());
  l.ac = "full";  // the forward again: 4/3 of the work
  ASSERT_EQ(evaluate_layout(r, l, &p), "");
  EXPECT_NEAR(p.step, 4.0 / 3.0 * useful / (r.hardware.peak_flops * r.mfu), 1e-9 * p.step);
  EXPECT_NEAR(p.mfu, 0.75 * r.mfu, 1e-12);
  l.ac = "2";
  ASSERT_EQ(evaluate_layout(r, l, &p), "");
  EXPECT_NEAR(p.step, 7.0 / 6.0 * useful / (r.hardware.peak_flops * r.mfu), 1e-9 * p.step);
}

TEST(Planner, MoreNodesAreNotSlowerWhenComputeBound) {
  double previous = 1e30;
  for (int64_t nodes : {1, 2, 4}) {
    PlanRequest r = request_for("8B", 8192, 256, nodes, 8);
    r.hardware.intra_node_bps = 1e15;
    r.hardware.inter_node_bps = 1e15;
    const Plan plan = plan_layouts(r);
    ASSERT_FALSE(plan.ranked.empty());
    EXPECT_LE(plan.ranked[0].step, previous) << nodes << " nodes";
    previous = plan.ranked[0].step;
  }
}

TEST(Planner, ASlowerInterNodeLinkSlowsOnlyLayoutsThatCrossNodes) {
  PlanRequest fast = request_for("8B", 8192, 32, 2, 8);
  PlanRequest slow = fast;
  slow.hardware.inter_node_bps = fast.hardware.inter_node_bps / 10;
  Layout fsdp16;  // FSDP over both nodes
  fsdp16.dp_shard = 16;
  fsdp16.local_batch_size = 2;
  fsdp16.ac = "full";
  EXPECT_GT(step_of(slow, fsdp16), step_of(fast, fsdp16));
  Layout tp8;  // TP inside each node, DDP... here HSDP-free FSDP 2 across the nodes
  tp8.dp_shard = 2;
  tp8.tp = 8;
  tp8.local_batch_size = 16;
  tp8.ac = "full";
  Prediction p;
  ASSERT_EQ(evaluate_layout(fast, tp8, &p), "");
  for (const Collective& c : p.comm) EXPECT_EQ(c.inter_node, c.dim != "tp") << c.dim;
  EXPECT_GT(step_of(slow, tp8), step_of(fast, tp8));
  // One node: nothing crosses, the inter-node link does not matter.
  PlanRequest one_fast = request_for("8B", 8192, 16, 1, 8);
  PlanRequest one_slow = one_fast;
  one_slow.hardware.inter_node_bps /= 10;
  Layout fsdp8;
  fsdp8.dp_shard = 8;
  fsdp8.local_batch_size = 2;
  fsdp8.ac = "op";
  EXPECT_DOUBLE_EQ(step_of(one_slow, fsdp8), step_of(one_fast, fsdp8));
}

TEST(Planner, BubbleIsTheScheduleSimulation) {
  PlanRequest r = request_for("8B", 8192, 8, 1, 4);
  r.hardware.memory_bytes = 1e6 * kGiB;
  Layout l;
  l.pp = 4;
  l.dp_shard = 1;
  l.schedule = "1F1B";
  l.local_batch_size = 8;
  Prediction p;
  ASSERT_EQ(evaluate_layout(r, l, &p), "");
  const pp::SimulationResult sim =
      pp::simulate_schedule(pp::generate_schedule(pp::ScheduleKind::k1F1B, {4, 1, 8}));
  EXPECT_NEAR(p.bubble_fraction, sim.bubble_fraction(), 1e-12);
  EXPECT_NEAR(p.bubble_fraction, 3.0 / 11.0, 1e-12);  // (p-1)/(m+p-1)
  // Bubble and compute: compute / (1 - bubble) of the pipeline, plus its send/recv.
  EXPECT_NEAR(p.bubble, p.compute * 3.0 / 8.0, 1e-9 * p.step);
  EXPECT_GT(p.step, p.compute + p.bubble);
  // Interleaving shrinks the bubble.
  l.schedule = "Interleaved1F1B";
  Prediction q;
  ASSERT_EQ(evaluate_layout(r, l, &q), "");
  EXPECT_LT(q.bubble, p.bubble);
}

TEST(Planner, MixtureOfExpertsLayoutsUseExpertParallelism) {
  PlanRequest r = request_for("debugmodel_moe", 256, 8, 1, 8);
  r.config.model.name = "qwen3";
  const Plan plan = plan_layouts(r);
  bool saw_ep = false, saw_etp = false;
  for (const Prediction& p : plan.ranked) {
    const Layout& l = p.layout;
    EXPECT_TRUE(l.etp == 1 || l.etp == l.tp) << l.describe();
    saw_etp |= l.etp > 1;
    if (l.ep == 1) continue;
    saw_ep = true;
    // ep borrows cp x tp, or only cp when the experts are split over tp.
    const int64_t borrowed = l.etp > 1 ? l.cp : l.cp * l.tp;
    EXPECT_EQ(l.ep % borrowed, 0) << l.describe();
    EXPECT_EQ((l.dp_shard * borrowed) % l.ep, 0) << l.describe();
    EXPECT_EQ(64 % l.ep, 0) << l.describe();
    bool has_ep_comm = false;
    for (const Collective& c : p.comm) has_ep_comm |= c.dim == "ep" && c.bytes > 0;
    EXPECT_TRUE(has_ep_comm) << l.describe();
  }
  EXPECT_TRUE(saw_ep);
  EXPECT_TRUE(saw_etp);
  // Tied embeddings refuse tensor parallelism, as the trainer does.
  const Plan tied = plan_layouts(request_for("1B", 2048, 8, 1, 8));
  EXPECT_GT(tied.rejected.at("tp with tied embeddings"), 0);
  for (const Prediction& p : tied.ranked) EXPECT_EQ(p.layout.tp, 1);
}

// TP on an MoE model as the trainer runs it: with etp 1 every tp rank keeps whole experts
// (memory: FSDP's share of them, not tp's; traffic: no gathers around the MoE blocks, and the
// experts' gradients all-reduced over tp once per step); with etp = tp they split like the rest.
TEST(Planner, TensorParallelMixtureOfExpertsKeepsOrSplitsTheExperts) {
  PlanRequest r = request_for("debugmodel_moe", 256, 8, 1, 8);
  r.config.model.name = "qwen3";
  const ModelSpec& spec = get_model_spec("qwen3");
  const double experts = static_cast<double>(routed_expert_params(spec, "debugmodel_moe"));
  const double n =
      static_cast<double>(spec.describe("debugmodel_moe", 1, 256, at::kBFloat16).n_params);
  Layout l;
  l.dp_shard = 4;
  l.tp = 2;
  l.accumulation_steps = 2;
  Prediction whole, split;
  ASSERT_EQ(evaluate_layout(r, l, &whole), "");
  l.etp = 2;
  ASSERT_EQ(evaluate_layout(r, l, &split), "");
  // fp32 weights: experts over dp_shard (4) only, or over dp_shard x tp (8) like the rest.
  EXPECT_NEAR(whole.memory.parts[0].bytes, 4 * ((n - experts) / 8 + experts / 4), 1e-6 * n);
  EXPECT_NEAR(split.memory.parts[0].bytes, 4 * n / 8, 1e-6 * n);
  const auto find = [](const Prediction& p, const std::string& dim) -> const Collective* {
    for (const Collective& c : p.comm) {
      if (c.dim == dim) return &c;
    }
    return nullptr;
  };
  const Collective* grads = find(whole, "tp grads");
  ASSERT_NE(grads, nullptr);
  EXPECT_NEAR(grads->bytes, 2 * 4 * experts / 4 / 2, 1e-9 * experts);  // once per step
  EXPECT_EQ(grads->count, 1);
  EXPECT_EQ(find(split, "tp grads"), nullptr);
  // Per microbatch: 8 sequence-parallel collectives per block with split experts, 4 fewer per
  // MoE block (all of debugmodel_moe's 8) with whole ones; 4 for the embedding and output.
  ASSERT_NE(find(whole, "tp"), nullptr);
  ASSERT_NE(find(split, "tp"), nullptr);
  EXPECT_DOUBLE_EQ(find(split, "tp")->count, 2 * (8 * 8 + 4));
  EXPECT_DOUBLE_EQ(find(whole, "tp")->count, 2 * (4 * 8 + 4));
  // The trainer's rules: etp is 1 or tp, and only for MoE models.
  l.etp = 4;
  EXPECT_EQ(evaluate_layout(r, l, nullptr), "etp neither 1 nor tp");
  PlanRequest dense = request_for("debugmodel", 256, 8, 1, 8);
  l.etp = 2;
  EXPECT_EQ(evaluate_layout(dense, l, nullptr), "etp without MoE");
}

TEST(Planner, TheConfigsLayoutIsRanked) {
  PlanRequest r = request_for("8B", 8192, 16, 1, 8);
  r.config.parallelism.data_parallel_shard_degree = -1;
  r.config.training.local_batch_size = 2;
  r.config.activation_checkpoint.mode = "selective";
  r.config.activation_checkpoint.selective_ac_option = "op";
  const Plan plan = plan_layouts(r);
  ASSERT_TRUE(plan.config_layout.has_value());
  EXPECT_EQ(plan.config_layout->layout.dp_shard, 8);
  ASSERT_GE(plan.config_rank, 0);
  EXPECT_LE(plan.ranked[plan.config_rank].step, plan.config_layout->step);
  // Fixed keys hold: only tp 2 layouts.
  r.fix_tp = true;
  r.config.parallelism.tensor_parallel_degree = 2;
  for (const Prediction& p : plan_layouts(r).ranked) EXPECT_EQ(p.layout.tp, 2);
}

// What the search leaves out cannot rank first: tensor parallelism across nodes (unless fixed)
// and, for a layout that fits with a lighter activation checkpointing, the heavier ones (more
// recomputation on the same layout): every ranked layout's other modes do not fit or are slower.
TEST(Planner, TheSearchLeavesOutOnlyDominatedLayouts) {
  const PlanRequest r = request_for("8B", 8192, 32, /*nodes=*/2, /*gpus_per_node=*/8);
  const Plan plan = plan_layouts(r);
  ASSERT_FALSE(plan.ranked.empty());
  EXPECT_GT(plan.rejected.at("slower than a lighter AC that fits"), 0);
  for (const Prediction& p : plan.ranked) {
    SCOPED_TRACE(p.layout.describe());
    EXPECT_LE(p.layout.tp, 8);
    // Another checkpointing of the same layout either does not fit or is not faster.
    for (const std::string& ac : r.ac_modes) {
      if (ac == p.layout.ac) continue;
      Layout other = p.layout;
      other.ac = ac;
      Prediction q;
      if (evaluate_layout(r, other, &q) == "") {
        EXPECT_GE(q.step, p.step) << "AC " << ac;
      }
    }
  }
  // Absurd sizes are refused up front with the limit; reserved memory cannot exceed the device's.
  PlanRequest huge = r;
  huge.nodes = 1000000000;
  EXPECT_TRUE(contains(message_of([&] { huge.validate(); }), "titan plan plans at most 1048576"));
  PlanRequest reserved = r;
  reserved.hardware.reserved_bytes = 1000 * kGiB;
  EXPECT_TRUE(contains(message_of([&] { reserved.validate(); }),
                       "--reserved_gib 1000 must be >= 0 and below the device memory"));
}

TEST(Planner, BadRequestsNameTheFlag) {
  PlanRequest r = request_for("8B", 8192, 16, 1, 8);
  r.nodes = 0;
  EXPECT_TRUE(contains(message_of([&] { r.validate(); }), "--nodes must be >= 1"));
  r.nodes = 1;
  r.mfu = 1.5;
  EXPECT_TRUE(contains(message_of([&] { r.validate(); }), "--mfu"));
  r.mfu = 0.4;
  r.ac_modes = {"sometimes"};
  EXPECT_TRUE(contains(message_of([&] { r.validate(); }), "--ac 'sometimes'"));
  r.ac_modes = {"full"};
  r.schedules = {"1F1C"};
  EXPECT_TRUE(contains(message_of([&] { r.validate(); }), "--pp_schedules"));
  r.schedules = {"1F1B"};
  r.hardware.inter_node_bps = 0;
  EXPECT_TRUE(contains(message_of([&] { r.validate(); }), "--inter_node_gbps"));
  const std::string gpu = message_of([] { gpu_preset("h1000"); });
  EXPECT_TRUE(contains(gpu, "--gpu 'h1000' is not a GPU preset")) << gpu;
  EXPECT_TRUE(contains(gpu, "h100")) << gpu;
  EXPECT_DOUBLE_EQ(gpu_preset("H200").memory_bytes, 141 * kGiB);
  EXPECT_DOUBLE_EQ(gpu_preset("a100").peak_flops, 312e12);
}

}  // namespace test_planner
}  // namespace titan
