// The pipeline stage split of TorchTitan's pipeline_llm on an 8-layer Llama: stages per rank by
// schedule and layers_per_stage, the module FQNs of each stage with the first / last stage
// lighter, loop and V placement, explicit module_fqns_per_model_part, microbatches, a schedule
// CSV checked against the placement, and the errors with their arithmetic.
#include "../test_util.h"
#include "titan/common/check.h"
#include "titan/plan/pipeline_split.h"

#include <gtest/gtest.h>

namespace titan::pp {
namespace test_pipeline_split {

using test::contains;
using test::message_of;
using Parts = std::vector<std::vector<std::string>>;

ParallelismSection pipeline(int64_t pp, const std::string& schedule) {
  ParallelismSection p;
  p.pipeline_parallel_degree = pp;
  p.pipeline_parallel_schedule = schedule;
  return p;
}

TEST(PipelineSplit, EightLayersOverTwoAndFourStages) {
  EXPECT_EQ(generate_llm_fqns_per_stage(2, 8, 1, 1),
            (Parts{{"tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3"},
                   {"layers.4", "layers.5", "layers.6", "layers.7", "norm", "output"}}));
  // 10 effective layers over 4 stages: 3, 3, 2, 2 (earlier stages take the remainder).
  EXPECT_EQ(generate_llm_fqns_per_stage(4, 8, 1, 1),
            (Parts{{"tok_embeddings", "layers.0", "layers.1"},
                   {"layers.2", "layers.3", "layers.4"},
                   {"layers.5", "layers.6"},
                   {"layers.7", "norm", "output"}}));
  // No weighting: 8 layers evenly, embedding and output on top.
  EXPECT_EQ(generate_llm_fqns_per_stage(2, 8, 0, 0),
            (Parts{{"tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3"},
                   {"layers.4", "layers.5", "layers.6", "layers.7", "norm", "output"}}));
  // Heavier ends: 12 effective over 4 = 3 each; first and last hold 1 layer.
  EXPECT_EQ(generate_llm_fqns_per_stage(4, 8, 2, 2), (Parts{{"tok_embeddings", "layers.0"},
                                                            {"layers.1", "layers.2", "layers.3"},
                                                            {"layers.4", "layers.5", "layers.6"},
                                                            {"layers.7", "norm", "output"}}));
  EXPECT_EQ(generate_llm_fqns_per_stage(1, 2, 1, 1),
            (Parts{{"tok_embeddings", "layers.0", "layers.1", "norm", "output"}}));
}

TEST(PipelineSplit, SplitErrorsShowTheArithmetic) {
  std::string m = message_of([] { generate_llm_fqns_per_stage(11, 8, 1, 1); });
  EXPECT_TRUE(contains(m, "8 layers + 1 (embedding) + 1 (norm + output) = 10 over 11 stages")) << m;
  // 13 effective layers over 4 stages: 3 per stage, less than the embedding's weight of 4.
  m = message_of([] { generate_llm_fqns_per_stage(4, 8, 4, 1); });
  EXPECT_TRUE(contains(m, "(4, 1) exceed the 3 layers per stage")) << m;
  EXPECT_EQ(message_of([] { generate_llm_fqns_per_stage(4, 8, 3, 3); }), "");
}

TEST(PipelineSplit, StagesPerRank) {
  EXPECT_EQ(pipeline_stages_per_rank(ScheduleKind::k1F1B, 4, 8, -1, 1, 1), 1);
  EXPECT_EQ(pipeline_stages_per_rank(ScheduleKind::kInterleaved1F1B, 4, 8, -1, 1, 1), 2);
  // ceil(10 / 3) = 4 stages over 2 ranks.
  EXPECT_EQ(pipeline_stages_per_rank(ScheduleKind::kLoopedBFS, 2, 8, 3, 1, 1), 2);
  // ceil(10 / 1) = 10 stages over 2 ranks.
  EXPECT_EQ(pipeline_stages_per_rank(ScheduleKind::kInterleaved1F1B, 2, 8, 1, 1, 1), 5);
  EXPECT_EQ(pipeline_stages_per_rank(ScheduleKind::kGPipe, 2, 8, 5, 1, 1), 1);
  std::string m =
      message_of([] { pipeline_stages_per_rank(ScheduleKind::kInterleaved1F1B, 3, 8, 3, 1, 1); });
  EXPECT_TRUE(contains(m,
                       "pipeline_parallel_layers_per_stage = 3 gives ceil((8 layers + 1 "
                       "(embedding) + 1 (norm + output)) / 3) = 4 stages, not a multiple of "
                       "pipeline_parallel_degree 3 (4 % 3 = 1)"))
      << m;
  m = message_of([] { pipeline_stages_per_rank(ScheduleKind::k1F1B, 2, 8, 3, 1, 1); });
  EXPECT_TRUE(contains(m, "1F1B runs one stage per rank")) << m;
  EXPECT_TRUE(contains(m, "= 2 per rank")) << m;
  m = message_of([] { pipeline_stages_per_rank(ScheduleKind::kInterleaved1F1B, 2, 8, 5, 1, 1); });
  EXPECT_TRUE(contains(m, "at least 2 stages per rank")) << m;
  m = message_of([] { pipeline_stages_per_rank(ScheduleKind::kZBVZeroBubble, 2, 8, 1, 1, 1); });
  EXPECT_TRUE(contains(m, "exactly 2 stages per rank")) << m;
  m = message_of([] { pipeline_stages_per_rank(ScheduleKind::k1F1B, 2, 8, 0, 1, 1); });
  EXPECT_TRUE(contains(m, "must be >= 1, or -1")) << m;
}

TEST(PipelineSplit, ValidatePipelineLoopAndV) {
  PipelineLayout layout = validate_pipeline(pipeline(2, "interleaved1f1b"), 8, 8);
  EXPECT_EQ(layout.schedule, ScheduleKind::kInterleaved1F1B);
  EXPECT_EQ(layout.n_stages(), 4);
  EXPECT_EQ(layout.n_microbatches, 8);
  EXPECT_EQ(layout.rank_stage_ids, (std::vector<std::vector<int64_t>>{{0, 2}, {1, 3}}));
  EXPECT_EQ(layout.module_fqns, generate_llm_fqns_per_stage(4, 8, 1, 1));
  EXPECT_EQ(layout.table, generate_schedule(ScheduleKind::kInterleaved1F1B, {2, 2, 8}));

  ParallelismSection zbv = pipeline(2, "ZBVZeroBubble");
  zbv.pipeline_parallel_microbatch_size = 2;
  layout = validate_pipeline(zbv, 8, 8);
  EXPECT_EQ(layout.n_microbatches, 4);
  EXPECT_EQ(layout.placement, StagePlacement::kV);
  EXPECT_EQ(layout.rank_stage_ids, (std::vector<std::vector<int64_t>>{{0, 3}, {1, 2}}));
  EXPECT_EQ(layout.stage_rank, (std::vector<int64_t>{0, 1, 1, 0}));

  layout = validate_pipeline(pipeline(1, "1F1B"), 8, 2);
  EXPECT_EQ(layout.module_fqns.size(), 1u);
  EXPECT_EQ(layout.module_fqns[0].size(), 11u);
}

TEST(PipelineSplit, ValidatePipelineErrors) {
  ParallelismSection p = pipeline(2, "1F1B");
  p.pipeline_parallel_microbatch_size = 3;
  std::string m = message_of([&] { validate_pipeline(p, 8, 8); });
  EXPECT_TRUE(contains(m,
                       "training.local_batch_size 8 is not a multiple of "
                       "parallelism.pipeline_parallel_microbatch_size 3 (8 % 3 = 2)"))
      << m;
  m = message_of([] { validate_pipeline(pipeline(4, "1F1B"), 8, 2); });
  EXPECT_TRUE(contains(m, "2 microbatches < 4 stages")) << m;
  m = message_of([] { validate_pipeline(pipeline(4, "DualPipeV"), 8, 6); });
  EXPECT_TRUE(contains(m, "6 microbatches < 4 ranks * 2 stages per rank = 8 stages")) << m;
  m = message_of([] { validate_pipeline(pipeline(2, "1F1F"), 8, 8); });
  EXPECT_TRUE(contains(m, "did you mean '1F1B'")) << m;
  m = message_of([] { validate_pipeline(pipeline(8, "Interleaved1F1B"), 8, 8); });
  EXPECT_TRUE(contains(m, "10 over 16 stages")) << m;
}

TEST(PipelineSplit, ExplicitModuleFqns) {
  ParallelismSection p = pipeline(2, "1F1B");
  p.module_fqns_per_model_part = {{"tok_embeddings", "layers.0"},
                                  {"layers.1", "layers.2", "layers.3", "norm", "output"}};
  const PipelineLayout layout = validate_pipeline(p, 4, 4);
  EXPECT_EQ(layout.module_fqns, p.module_fqns_per_model_part);
  EXPECT_EQ(layout.stages_per_rank, 1);

  const auto error = [](const Parts& parts) {
    return message_of([&] { check_module_fqns(parts, 4, 2); });
  };
  std::string m = error({{"tok_embeddings", "layers.0", "layers.1"},
                         {"layers.1", "layers.2", "layers.3", "norm", "output"}});
  EXPECT_TRUE(contains(m, "part 1 lists 'layers.1' again (part 0 has it)")) << m;
  m = error(
      {{"tok_embeddings", "layers.1"}, {"layers.0", "layers.2", "layers.3", "norm", "output"}});
  EXPECT_TRUE(contains(m, "part 0 lists 'layers.1' where 'layers.0' comes next")) << m;
  m = error({{"tok_embeddings", "layers.0", "layers.1"}, {"layers.2", "layers.3", "norm"}});
  EXPECT_TRUE(contains(m, "leaves out 'output'")) << m;
  m = error(
      {{"tok_embedings", "layers.0"}, {"layers.1", "layers.2", "layers.3", "norm", "output"}});
  EXPECT_TRUE(contains(m, "did you mean 'tok_embeddings'")) << m;
  m = error({{"tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "norm", "output"}});
  EXPECT_TRUE(contains(m, "has 1 parts, the pipeline has 2 stages")) << m;
  m = error(
      {{"tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "norm", "output"}, {}});
  EXPECT_TRUE(contains(m, "part 1 is empty")) << m;

  p.pipeline_parallel_schedule = "ZBVZeroBubble";
  m = message_of([&] { validate_pipeline(p, 4, 4); });
  EXPECT_TRUE(contains(m, "exactly 2 stages per rank")) << m;
  p.pipeline_parallel_degree = 3;
  m = message_of([&] { validate_pipeline(p, 4, 4); });
  EXPECT_TRUE(contains(m, "2 parts, not a multiple of pipeline_parallel_degree 3")) << m;
}

TEST(PipelineSplit, ScheduleCsvIsCheckedAgainstThePlacement) {
  const auto dir = test::fresh_test_dir("pipeline_csv");
  const std::string path = (dir / "schedule.csv").string();
  // A PyTorch-style table for Interleaved1F1B on 2 ranks, 4 microbatches: loads as generated.
  test::write_file(path,
                   dump_schedule_csv(generate_schedule(ScheduleKind::kInterleaved1F1B, {2, 2, 4})));
  ParallelismSection p = pipeline(2, "Interleaved1F1B");
  p.pipeline_parallel_schedule_csv = path;
  const PipelineLayout layout = validate_pipeline(p, 8, 4);
  EXPECT_TRUE(layout.from_csv);
  EXPECT_EQ(layout.table, generate_schedule(ScheduleKind::kInterleaved1F1B, {2, 2, 4}));
  // The same table under a V schedule puts stages 2 and 3 on the wrong ranks.
  p.pipeline_parallel_schedule = "ZBVZeroBubble";
  std::string m = message_of([&] { validate_pipeline(p, 8, 4); });
  EXPECT_TRUE(contains(m,
                       "runs stage 2 on rank 0, but ZBVZeroBubble's v placement puts it on "
                       "rank 1"))
      << m;
  // Sends and receives are the runtime's business.
  test::write_file(path, "0F0,0SEND_F0,0B0\r\n1F0,1B0\r\n");
  p.pipeline_parallel_schedule = "1F1B";
  m = message_of([&] { validate_pipeline(p, 8, 1); });
  EXPECT_TRUE(contains(m, "rank 0, step 1 holds 0SEND_F0")) << m;
  // A table that deadlocks fails here, not in training.
  test::write_file(path, "0F0,0B0,0F1,0B1\r\n1F1,1F0,1B0,1B1\r\n");
  m = message_of([&] { validate_pipeline(p, 8, 2); });
  EXPECT_TRUE(contains(m, "deadlocks")) << m;
  std::filesystem::remove_all(dir);
}

}  // namespace test_pipeline_split
}  // namespace titan::pp
