// Pipeline and context parallelism through the Trainer (threads as ranks): every schedule at
// pp 2 and pp 4; PP composed with FSDP, DDP, HSDP, TP, all three (pp 2 x dp_shard 2 x tp 2) and
// gradient accumulation, and the zero-bubble schedules' I/W split with those, each activation
// checkpointing mode and float8; context parallelism at cp 2 and 4 with both rotate methods,
// with and without head-tail balancing, and with FSDP, TP and PP. Each reproduces the
// one-process run of the same seed and global batch (float8: 1F1B's run of the same
// microbatches): losses within 1e-5 relative at every step, grad norms within 1e-4, the
// validation loss, and the final parameters. Checkpoints move between PP, CP and other layouts
// both ways.
#include "../test_util.h"
#include "trainer_ranks.h"

#include "titan/parallel/parallelized_model.h"
#include "titan/trainer/trainer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <map>

namespace titan {
namespace test_trainer_pipeline {

namespace fs = std::filesystem;

constexpr int64_t kGlobalBatch = 8;
constexpr int64_t kSteps = 3;

struct PpLayout {
  std::string schedule;
  int64_t pp = 2, dp_replicate = 1, dp_shard = 1, tp = 1;
  int64_t accumulation = 1;  // gradient accumulation steps
  int64_t cp = 1;
  std::string rotate = "allgather", balancer = "headtail";
  std::string ac;       // activation checkpointing: full or op (empty: the config's default)
  bool float8 = false;  // float8 linears, emulated (tensorwise)
  int64_t world() const { return pp * dp_replicate * dp_shard * tp * cp; }
  int64_t dp() const { return dp_replicate * dp_shard; }
  std::string name() const {
    std::string n = pp > 1 ? schedule + " pp " + std::to_string(pp) : "";
    if (cp > 1) {
      n += (n.empty() ? "cp " : " x cp ") + std::to_string(cp) + " (" + rotate + ", " + balancer +
           ")";
    }
    if (dp_replicate > 1) n += " x dp_replicate " + std::to_string(dp_replicate);
    if (dp_shard > 1) n += " x dp_shard " + std::to_string(dp_shard);
    if (tp > 1) n += " x tp " + std::to_string(tp);
    if (accumulation > 1) n += ", " + std::to_string(accumulation) + " accumulation steps";
    if (!ac.empty()) n += ", " + ac + " AC";
    if (float8) n += ", float8";
    return n;
  }
};

JobConfig config_for(const fs::path& dump, const std::string& flavor, const PpLayout& layout) {
  JobConfig c = test::tiny_training_config(dump.string());
  c.model.flavor = flavor;
  c.training.steps = kSteps;
  c.training.local_batch_size = kGlobalBatch / layout.dp() / layout.accumulation;
  c.training.global_batch_size = kGlobalBatch;
  c.lr_scheduler.warmup_steps = 1;
  c.debug.seed = 7;
  c.validation.enable = true;
  c.validation.freq = kSteps;
  c.validation.steps = 2;
  c.validation.local_batch_size = 4 / layout.dp();  // the same validation batch in every layout
  c.validation.seq_len = 32;
  c.parallelism.pipeline_parallel_degree = layout.pp;
  c.parallelism.pipeline_parallel_schedule = layout.schedule;
  c.parallelism.data_parallel_replicate_degree = layout.dp_replicate;
  c.parallelism.data_parallel_shard_degree = layout.dp_shard;
  c.parallelism.tensor_parallel_degree = layout.tp;
  c.parallelism.context_parallel_degree = layout.cp;
  c.parallelism.context_parallel_rotate_method = layout.rotate;
  c.parallelism.context_parallel_load_balancer = layout.balancer;
  if (!layout.ac.empty()) {
    c.activation_checkpoint.mode = layout.ac == "op" ? "selective" : layout.ac;
    c.activation_checkpoint.selective_ac_option = "op";
  }
  if (layout.float8) {
    c.model.converters = {"quantize.linear.float8"};
    c.quantize.linear.float8.emulate = true;
  }
  return c;
}

struct Outcome {
  TrainResult result;
  std::map<std::string, at::Tensor> params;  // whole, after training
};

Outcome one_process(const fs::path& dump, const std::string& flavor) {
  Trainer trainer(config_for(dump, flavor, {"1F1B", 1}));
  Outcome run;
  run.result = trainer.train();
  for (const auto& [name, t] : trainer.parallelized().gather_full_parameters()) {
    run.params[name] = t;
  }
  return run;
}

Outcome on_layout(const fs::path& dump, const std::string& flavor, const PpLayout& layout) {
  Outcome run;
  test::on_ranks(config_for(dump, flavor, layout), layout.world(), [&](int64_t r, Trainer& t) {
    TrainResult result = t.train();
    auto full = t.parallelized().gather_full_parameters();  // collective: every rank
    if (r != 0) return;
    run.result = result;
    for (const auto& [name, tensor] : full) run.params[name] = tensor;
  });
  return run;
}

void expect_same_run(const Outcome& got, const Outcome& want, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.result.losses.size(), want.result.losses.size());
  double worst = 0;
  for (size_t s = 0; s < want.result.losses.size(); ++s) {
    const double rel =
        std::abs(got.result.losses[s] - want.result.losses[s]) / want.result.losses[s];
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 1e-5) << "step " << s + 1 << ": " << got.result.losses[s] << " vs "
                         << want.result.losses[s];
    EXPECT_NEAR(got.result.grad_norms[s], want.result.grad_norms[s],
                1e-4 * want.result.grad_norms[s])
        << "step " << s + 1;
  }
  ASSERT_EQ(got.result.validation_losses.size(), 1u);
  EXPECT_NEAR(got.result.validation_losses[0], want.result.validation_losses[0],
              1e-5 * want.result.validation_losses[0]);
  ASSERT_EQ(got.params.size(), want.params.size());
  double worst_param = 0;
  for (const auto& [name, w] : want.params) {
    auto it = got.params.find(name);
    ASSERT_NE(it, got.params.end()) << name;
    ASSERT_EQ(it->second.sizes(), w.sizes()) << name;
    worst_param = std::max(worst_param, (it->second - w).abs().max().item<double>());
    EXPECT_TRUE(at::allclose(it->second, w, 1e-4, 1e-5)) << name;
  }
  std::printf("%s vs one process: worst loss %.2e relative, worst parameter %.2e\n", what.c_str(),
              worst, worst_param);
}

TEST(TrainerPipeline, EverySchedulePp2AndPp4ReproducesOneProcess) {
  const fs::path root = test::fresh_test_dir("titan_trainer_pipeline");
  // tiny: 2 layers, i.e. 4 stage-layers with the embedding and the head: one stage per rank at
  // pp 2 and pp 4, or two per rank at pp 2. debugmodel's 6 layers give two per rank at pp 4.
  const Outcome tiny = one_process(root / "tiny", "tiny");
  const Outcome deep = one_process(root / "deep", "debugmodel");
  const std::vector<std::string> multi = {"Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
                                          "ZBVZeroBubble", "DualPipeV"};
  for (const char* schedule : {"GPipe", "1F1B"}) {
    for (int64_t pp : {2, 4}) {
      const PpLayout layout{schedule, pp};
      expect_same_run(on_layout(root / layout.name(), "tiny", layout), tiny, layout.name());
    }
  }
  for (const std::string& schedule : multi) {
    const PpLayout two{schedule, 2};
    expect_same_run(on_layout(root / two.name(), "tiny", two), tiny, two.name());
    const PpLayout four{schedule, 4};
    expect_same_run(on_layout(root / four.name(), "debugmodel", four), deep,
                    four.name() + " (debugmodel)");
  }
  fs::remove_all(root);
}

TEST(TrainerPipeline, ComposesWithFsdpDdpHsdpAndTensorParallel) {
  const fs::path root = test::fresh_test_dir("titan_trainer_pipeline_nd");
  const Outcome tiny = one_process(root / "one", "tiny");
  const std::vector<PpLayout> layouts = {
      {"ZBVZeroBubble", 2, 1, 2, 1},    // PP x FSDP
      {"GPipe", 2, 2, 1, 1},            // PP x DDP
      {"1F1B", 2, 2, 2, 1},             // PP x HSDP
      {"Interleaved1F1B", 2, 1, 1, 2},  // PP x TP
      {"1F1B", 2, 1, 2, 2},             // 3D: PP x FSDP x TP
      {"GPipe", 2, 1, 2, 1, 2},         // PP x FSDP with gradient accumulation
  };
  for (const PpLayout& layout : layouts) {
    expect_same_run(on_layout(root / layout.name(), "tiny", layout), tiny, layout.name());
  }
  fs::remove_all(root);
}

// The zero-bubble schedules split each backward into I and W (pipeline.h): composed with DDP,
// TP, FSDP x TP, gradient accumulation and each activation checkpointing mode they reproduce one
// process. With float8 (whose dynamic scales depend on the microbatch) they reproduce 1F1B's run
// of the same microbatches, whose backward is not split.
TEST(TrainerPipeline, ZeroBubbleSplitComposes) {
  const fs::path root = test::fresh_test_dir("titan_trainer_pipeline_zb");
  const Outcome tiny = one_process(root / "one", "tiny");
  std::vector<PpLayout> layouts = {
      {"InterleavedZeroBubble", 2, 2, 1, 1},     // PP x DDP
      {"DualPipeV", 2, 1, 1, 2},                 // PP x TP
      {"ZBVZeroBubble", 2, 1, 2, 2},             // PP x FSDP x TP
      {"InterleavedZeroBubble", 2, 1, 2, 1, 2},  // PP x FSDP with gradient accumulation
  };
  PpLayout full{"InterleavedZeroBubble", 2, 1, 2, 1};
  full.ac = "full";
  PpLayout op{"ZBVZeroBubble", 2, 1, 2, 1};
  op.ac = "op";
  layouts.insert(layouts.end(), {full, op});
  for (const PpLayout& layout : layouts) {
    expect_same_run(on_layout(root / layout.name(), "tiny", layout), tiny, layout.name());
  }
  for (int64_t dp_shard : {1, 2}) {
    PpLayout one_f_one_b{"1F1B", 2, 1, dp_shard, 1};
    one_f_one_b.float8 = true;
    const Outcome want = on_layout(root / one_f_one_b.name(), "tiny", one_f_one_b);
    for (const char* schedule : {"InterleavedZeroBubble", "ZBVZeroBubble"}) {
      PpLayout zb = one_f_one_b;
      zb.schedule = schedule;
      zb.ac = dp_shard == 1 ? "op" : "full";
      expect_same_run(on_layout(root / zb.name(), "tiny", zb), want,
                      zb.name() + " (against " + one_f_one_b.name() + ")");
    }
  }
  fs::remove_all(root);
}

// Context parallelism (ring attention over the cp group): cp 2 and cp 4, both rotate methods,
// with and without head-tail load balancing, and with FSDP, TP and PP.
TEST(TrainerContextParallel, EveryLayoutReproducesOneProcess) {
  const fs::path root = test::fresh_test_dir("titan_trainer_context");
  const Outcome tiny = one_process(root / "one", "tiny");
  const auto cp = [](int64_t degree, const char* rotate, const char* balancer) {
    PpLayout l{"1F1B", 1};
    l.cp = degree;
    l.rotate = rotate;
    l.balancer = balancer;
    return l;
  };
  std::vector<PpLayout> layouts = {cp(2, "allgather", "headtail"), cp(2, "alltoall", "none"),
                                   cp(4, "alltoall", "headtail"), cp(4, "allgather", "none")};
  PpLayout fsdp = cp(2, "alltoall", "headtail");
  fsdp.dp_shard = 2;
  PpLayout tp = cp(2, "allgather", "headtail");
  tp.tp = 2;
  PpLayout pp = cp(2, "alltoall", "headtail");
  pp.pp = 2;
  layouts.insert(layouts.end(), {fsdp, tp, pp});
  for (const PpLayout& layout : layouts) {
    expect_same_run(on_layout(root / layout.name(), "tiny", layout), tiny, layout.name());
  }
  fs::remove_all(root);
}

// A checkpoint written under one layout resumes under another: steps 3 and 4 after resuming at
// step 2 are the uninterrupted one-process run's.
TEST(TrainerPipeline, CheckpointsMoveBetweenPipelineAndOtherLayouts) {
  const fs::path root = test::fresh_test_dir("titan_trainer_pipeline_ckpt");
  const auto with_checkpoints = [](JobConfig c) {
    c.training.steps = 4;
    c.validation.enable = false;
    c.checkpoint.enable = true;
    c.checkpoint.interval = 2;
    c.checkpoint.last_save_model_only = false;
    return c;
  };
  const PpLayout one{"1F1B", 1}, pp2{"1F1B", 2}, pp2_looped{"Interleaved1F1B", 2},
      fsdp2{"1F1B", 1, 1, 2, 1};
  PpLayout cp2{"1F1B", 1};
  cp2.cp = 2;
  const TrainResult reference =
      Trainer(with_checkpoints(config_for(root / "reference", "tiny", one))).train();
  ASSERT_EQ(reference.losses.size(), 4u);
  struct Move {
    PpLayout from, to;
  };
  const std::vector<Move> moves = {{pp2, fsdp2}, {pp2, one}, {fsdp2, pp2_looped},
                                   {one, pp2},   {cp2, pp2}, {pp2, cp2}};
  for (const Move& move : moves) {
    const std::string what = move.from.name() + " (" + std::to_string(move.from.world()) +
                             " ranks) -> " + move.to.name() + " (" +
                             std::to_string(move.to.world()) + " ranks)";
    SCOPED_TRACE(what);
    const fs::path dump = root / (std::to_string(&move - moves.data()));
    test::train_on_ranks(with_checkpoints(config_for(dump, "tiny", move.from)), move.from.world());
    fs::remove_all(dump / "checkpoint" / "step-4");  // resume from step 2
    const std::vector<TrainResult> resumed =
        test::train_on_ranks(with_checkpoints(config_for(dump, "tiny", move.to)), move.to.world());
    ASSERT_EQ(resumed[0].start_step, 3);
    ASSERT_EQ(resumed[0].losses.size(), 2u);
    for (size_t s = 0; s < 2; ++s) {
      EXPECT_NEAR(resumed[0].losses[s], reference.losses[s + 2], 1e-5 * reference.losses[s + 2])
          << what << " step " << s + 3;
    }
  }
  fs::remove_all(root);
}

}  // namespace test_trainer_pipeline
}  // namespace titan
