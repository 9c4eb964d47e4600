// validate_job_config(): every range rule, and the cross-field checks with their arithmetic.
#include "titan/config/config_manager.h"

#include "config_test_util.h"

#include <cmath>
#include <functional>

namespace titan {
namespace test_config_validate {

using config_test::config_error;
using config_test::contains;

// The message validate_job_config() gives for the defaults with `edit` applied.
std::string validation_error(const std::function<void(JobConfig&)>& edit) {
  JobConfig config;
  edit(config);
  return config_error([&] { validate_job_config(config); });
}

TEST(ConfigValidate, IntegerRanges) {
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.training.steps = 0; }),
                       "training.steps must be >= 1, got 0"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.training.local_batch_size = 0; }),
                       "training.local_batch_size must be >= 1, got 0"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.training.seq_len = -3; }),
                       "training.seq_len must be >= 1, got -3"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.training.num_threads = -1; }),
                       "training.num_threads must be >= 0, got -1"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.metrics.log_freq = 0; }),
                       "metrics.log_freq must be >= 1, got 0"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.lr_scheduler.warmup_steps = -1; }),
                       "lr_scheduler.warmup_steps must be >= 0, got -1"));
  EXPECT_TRUE(
      contains(validation_error([](JobConfig& c) { c.parallelism.fsdp_prefetch_units = -1; }),
               "parallelism.fsdp_prefetch_units must be >= 0, got -1"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.validation.freq = 0; }),
                       "validation.freq must be >= 1, got 0"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.validation.steps = 0; }),
                       "validation.steps must be -1"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.validation.local_batch_size = 0; }),
                       "validation.local_batch_size must be >= 1, got 0"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.validation.seq_len = 0; }),
                       "validation.seq_len must be >= 1, got 0"));
}

TEST(ConfigValidate, FloatRanges) {
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.optimizer.lr = 0; }),
                       "optimizer.lr must be > 0, got 0"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.optimizer.lr = NAN; }),
                       "'optimizer.lr' must be a finite number, got nan"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.optimizer.eps = -1e-8; }),
                       "optimizer.eps must be > 0, got -1e-08"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.optimizer.weight_decay = -0.1; }),
                       "optimizer.weight_decay must be >= 0, got -0.1"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.optimizer.beta1 = 1.0; }),
                       "optimizer.beta1 must be in [0, 1), got 1"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.optimizer.beta2 = -0.5; }),
                       "optimizer.beta2 must be in [0, 1), got -0.5"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.lr_scheduler.min_lr_factor = 1.5; }),
                       "lr_scheduler.min_lr_factor must be in [0, 1], got 1.5"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.lr_scheduler.decay_ratio = 1.2; }),
                       "lr_scheduler.decay_ratio must be -1 (unset"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.lr_scheduler.decay_ratio = -0.5; }),
                       "got -0.5"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.metrics.peak_flops = -1; }),
                       "metrics.peak_flops must be >= 0, got -1"));

  JobConfig edges;
  edges.optimizer.beta1 = 0;
  edges.optimizer.weight_decay = 0;
  edges.lr_scheduler.min_lr_factor = 1;
  edges.lr_scheduler.warmup_steps = 0;
  edges.lr_scheduler.decay_ratio = 1;
  EXPECT_NO_THROW(validate_job_config(edges));
}

TEST(ConfigValidate, Choices) {
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.optimizer.name = "SGD"; }),
                       "optimizer.name must be one of AdamW, Adam, Muon; got 'SGD'"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.optimizer.state_dtype = "fp8"; }),
                       "optimizer.state_dtype must be one of float32, bfloat16; got 'fp8'"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.optimizer.muon_momentum = 1; }),
                       "optimizer.muon_momentum must be in [0, 1), got 1"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.optimizer.muon_ns_steps = 0; }),
                       "optimizer.muon_ns_steps must be >= 1, got 0"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.optimizer.muon_adamw_lr = 0; }),
                       "optimizer.muon_adamw_lr must be > 0, got 0"));
  EXPECT_TRUE(
      contains(validation_error([](JobConfig& c) { c.optimizer.muon_adamw_weight_decay = -2; }),
               "optimizer.muon_adamw_weight_decay must be >= 0, got -2"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.optimizer.muon_eps = 0; }),
                       "optimizer.muon_eps must be > 0, got 0"));
  EXPECT_TRUE(
      contains(validation_error([](JobConfig& c) { c.optimizer.implementation = "fast"; }),
               "optimizer.implementation must be one of fused, foreach, for-loop; got 'fast'"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) { c.lr_scheduler.decay_type = "exp"; }),
                       "lr_scheduler.decay_type must be one of linear, sqrt, cosine; got 'exp'"));
  EXPECT_TRUE(
      contains(validation_error([](JobConfig& c) { c.training.mixed_precision_param = "float16"; }),
               "training.mixed_precision_param must be one of bfloat16, float32; got 'float16'"));
  EXPECT_TRUE(contains(
      validation_error([](JobConfig& c) { c.training.mixed_precision_reduce = "bfloat16"; }),
      "training.mixed_precision_reduce must be one of float32; got 'bfloat16'"));

  JobConfig ok;
  ok.optimizer.name = "Adam";
  ok.optimizer.implementation = "for-loop";
  ok.lr_scheduler.decay_type = "cosine";
  ok.training.mixed_precision_param = "float32";
  EXPECT_NO_THROW(validate_job_config(ok));
}

TEST(ConfigValidate, ParallelDegrees) {
  EXPECT_TRUE(contains(
      validation_error([](JobConfig& c) { c.parallelism.data_parallel_replicate_degree = 0; }),
      "parallelism.data_parallel_replicate_degree must be >= 1, got 0"));
  EXPECT_TRUE(
      contains(validation_error([](JobConfig& c) { c.parallelism.data_parallel_shard_degree = 0; }),
               "parallelism.data_parallel_shard_degree must be -1"));
  EXPECT_TRUE(contains(
      validation_error([](JobConfig& c) { c.parallelism.data_parallel_shard_degree = -2; }),
      "got -2"));
  EXPECT_TRUE(
      contains(validation_error([](JobConfig& c) { c.parallelism.tensor_parallel_degree = 0; }),
               "parallelism.tensor_parallel_degree must be >= 1, got 0"));
  EXPECT_TRUE(
      contains(validation_error([](JobConfig& c) { c.parallelism.pipeline_parallel_degree = 0; }),
               "parallelism.pipeline_parallel_degree must be >= 1"));
  EXPECT_TRUE(
      contains(validation_error([](JobConfig& c) { c.parallelism.context_parallel_degree = -1; }),
               "parallelism.context_parallel_degree must be >= 1"));
  EXPECT_TRUE(
      contains(validation_error([](JobConfig& c) { c.parallelism.expert_parallel_degree = 0; }),
               "parallelism.expert_parallel_degree must be >= 1"));
  EXPECT_TRUE(contains(validation_error([](JobConfig& c) {
                         c.parallelism.expert_parallel_degree = 2;
                         c.parallelism.expert_parallel_comm_backend = "deepep";
                       }),
                       "expert_parallel_comm_backend = \"deepep\" (DeepEP's dispatch kernels) is "
                       "not available"));
}

TEST(ConfigValidate, GlobalBatchSizeMustBeMultipleOfLocalTimesDp) {
  std::string message = validation_error([](JobConfig& c) {
    c.training.local_batch_size = 8;
    c.training.global_batch_size = 12;
  });
  EXPECT_TRUE(contains(message,
                       "training.global_batch_size 12 must be a multiple of local_batch_size(8) * "
                       "dp(1) = 8 (gives 12 / 8 = 1.5 accumulation steps)"));

  // dp = replicate * shard.
  message = validation_error([](JobConfig& c) {
    c.training.local_batch_size = 2;
    c.training.global_batch_size = 12;
    c.parallelism.data_parallel_replicate_degree = 2;
    c.parallelism.data_parallel_shard_degree = 4;
  });
  EXPECT_TRUE(contains(message, "local_batch_size(2) * dp(8) = 16 (gives 12 / 16 = 0.75"));

  message = validation_error([](JobConfig& c) { c.training.global_batch_size = 0; });
  EXPECT_TRUE(contains(message, "training.global_batch_size must be -1"));
  EXPECT_TRUE(contains(message, "got 0"));

  JobConfig ok;
  ok.training.local_batch_size = 2;
  ok.parallelism.data_parallel_replicate_degree = 2;
  ok.parallelism.data_parallel_shard_degree = -1;  // counts as 1 until the world size is known
  ok.training.global_batch_size = 12;              // 3 accumulation steps of 2 * 2
  EXPECT_NO_THROW(validate_job_config(ok));
}

TEST(ConfigValidate, NumbersPrintWithoutFloatNoise) {
  std::string message = validation_error([](JobConfig& c) { c.optimizer.lr = -(0.1 + 0.2); });
  EXPECT_TRUE(contains(message, "got -0.3")) << message;
  EXPECT_FALSE(contains(message, "0.30000000000000004"));
}

}  // namespace test_config_validate
}  // namespace titan
