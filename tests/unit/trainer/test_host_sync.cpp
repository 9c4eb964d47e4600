// The lean step's budget of device-to-host reads (titan/common/host_sync.h), pinned on the CPU,
// where the counts are those a GPU run makes: steps that do not log read nothing back (dense
// models in every layout; MoE with the grouped kernels), a logged step reads once (its losses and
// gradient norms since the previous row, in one transfer), and MoE layers read their token
// counts only where they must (the float32 loop: once per layer and forward; expert parallelism:
// the one exchange of split sizes per layer and forward). metrics.jsonl carries the counts.
#include "../test_util.h"
#include "trainer_ranks.h"

#include "titan/common/host_sync.h"
#include "titan/components/data/dataset.h"
#include "titan/trainer/trainer.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace titan {
namespace host_sync_test {

namespace fs = std::filesystem;

constexpr int64_t kSteps = 8;
constexpr int64_t kLogFreq = 4;

struct Layout {
  std::string model = "llama3", flavor = "tiny";
  int64_t dp_shard = 1, tp = 1, pp = 1, ep = 1;
  std::string dtype = "float32";
  int64_t world() const { return dp_shard * tp * pp; }
};

JobConfig config_for(const fs::path& dump, const Layout& layout) {
  JobConfig c = test::tiny_training_config(dump.string());
  c.model.name = layout.model;
  c.model.flavor = layout.flavor;
  c.training.steps = kSteps;
  c.training.local_batch_size = 8 / layout.dp_shard;
  c.training.global_batch_size = 8;
  c.training.mixed_precision_param = layout.dtype;
  c.metrics.log_freq = kLogFreq;
  c.lr_scheduler.warmup_steps = 1;
  c.activation_checkpoint.mode = "none";  // one forward per step (recomputation would add one)
  c.debug.seed = 5;
  c.parallelism.data_parallel_shard_degree = layout.dp_shard;
  c.parallelism.tensor_parallel_degree = layout.tp;
  c.parallelism.pipeline_parallel_degree = layout.pp;
  c.parallelism.pipeline_parallel_schedule = "1F1B";
  c.parallelism.expert_parallel_degree = layout.ep;
  return c;
}

struct Row {
  int64_t step, host_syncs, between, comm_ops;
};

// metrics.jsonl's logged rows (rank 0 writes it).
std::vector<Row> logged_rows(const fs::path& dump) {
  std::ifstream in(dump / "metrics.jsonl");
  std::vector<Row> rows;
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    EXPECT_TRUE(j.contains("host_syncs") && j.contains("host_syncs_between_logs")) << line;
    rows.push_back({j.at("step").get<int64_t>(), j.value("host_syncs", int64_t{-1}),
                    j.value("host_syncs_between_logs", int64_t{-1}),
                    j.value("comm_ops", int64_t{-1})});
  }
  return rows;
}

// Trains `layout` and checks every logged row: `per_step` reads on steps that do not log, and
// the same plus the one read of the step's values on logged steps (step 1 may read more: a
// pipeline learns its activation shapes then). `comm_ops` >= 0: the communication ops of every
// logged step (metrics.jsonl's comm_ops, from the flight recorder).
void expect_budget(const Layout& layout, int64_t per_step, const std::string& tag,
                   int64_t comm_ops = -1) {
  const fs::path dump = test::fresh_test_dir("titan_host_sync_" + tag);
  const JobConfig config = config_for(dump, layout);
  if (layout.world() == 1) {
    Trainer(config).train();
  } else {
    test::train_on_ranks(config, layout.world());
  }
  const std::vector<Row> rows = logged_rows(dump);
  ASSERT_EQ(rows.size(), 3u) << tag;  // steps 1, 4, 8
  for (const Row& r : rows) {
    SCOPED_TRACE(tag + ", step " + std::to_string(r.step));
    if (r.step == 1) {
      EXPECT_GE(r.host_syncs, 1 + per_step);
      EXPECT_EQ(r.between, 0);
      continue;
    }
    EXPECT_EQ(r.host_syncs, 1 + per_step);
    EXPECT_EQ(r.between, per_step);
    if (comm_ops >= 0) {
      EXPECT_EQ(r.comm_ops, comm_ops);
    }
  }
}

bool corpus_available() { return fs::exists(default_dataset_path("sotu")); }

#define REQUIRE_CORPUS() \
  if (!corpus_available()) GTEST_SKIP() << "sotu corpus missing; run scripts/setup.sh"

TEST(HostSync, CountsReadsPerThread) {
  const int64_t before = host_sync_count();
  const at::Tensor t = at::ones({2});
  EXPECT_EQ(host_item<float>(t.sum()), 2.0f);
  EXPECT_TRUE(to_host(t).is_same(t));  // as is on the CPU, counted all the same
  EXPECT_EQ(host_sync_count() - before, 2);
  std::thread([] { EXPECT_EQ(host_sync_count(), 0); }).join();
}

TEST(HostSync, DenseStepsReadNothingBack) {
  REQUIRE_CORPUS();
  expect_budget({}, 0, "dense");
}

TEST(HostSync, DenseStepsReadNothingBackUnderFsdpTpPp) {
  REQUIRE_CORPUS();
  Layout fsdp;
  fsdp.dp_shard = 2;
  // The tiny model's 4 FSDP units (embedding, 2 blocks, norm with output): an all-gather each in
  // forward, again in backward but for the last unit (kept gathered), a reduce-scatter each,
  // then the loss's mean and the gradient norm: 4 + 3 + 4 + 2 collectives, each at least one
  // round trip over the network (bench/fsdp_latency_bench.sh).
  expect_budget(fsdp, 0, "fsdp", 13);
  Layout tp;
  tp.tp = 2;
  expect_budget(tp, 0, "tp");
  Layout pp;
  pp.pp = 2;
  expect_budget(pp, 0, "pp");
}

TEST(HostSync, MoEReadsCountsOnlyWhereItMust) {
  REQUIRE_CORPUS();
  Layout grouped;  // bf16: grouped GEMMs with the counts on the device
  grouped.model = "qwen3";
  grouped.flavor = "tiny_moe";
  grouped.dtype = "bfloat16";
  expect_budget(grouped, 0, "moe_grouped");
  Layout loop = grouped;  // float32: one GEMM per expert, the counts read per layer
  loop.dtype = "float32";
  expect_budget(loop, 2, "moe_loop");
  Layout ep = grouped;  // the split sizes of the exchange, once per layer
  ep.dp_shard = 2;
  ep.ep = 2;
  expect_budget(ep, 2, "moe_ep");
}

}  // namespace host_sync_test
}  // namespace titan
