// Full bf16 training (training.dtype): parameter casting and the compute dtype.
#include "titan/components/training_dtype.h"

#include "titan/common/check.h"
#include "titan/common/format.h"

#include <ATen/core/grad_mode.h>

namespace titan {

at::ScalarType training_compute_dtype(const TrainingSection& training) {
  return training.dtype == "bfloat16" ? at::kBFloat16
                                      : dtype_from_name(training.mixed_precision_param);
}

void apply_training_dtype(torch::nn::Module& model, const TrainingSection& training,
                          int64_t world_size, const std::string& parallelism) {
  const at::ScalarType dtype = dtype_from_name(training.dtype);
  if (dtype == at::kFloat) return;
  if (world_size > 1) {
    throw ConfigError(
        message("training.dtype = \"", training.dtype, "\" is not supported yet with ", parallelism,
                " (", world_size,
                " ranks): the data- and tensor-parallel paths keep float32 parameters. "
                "HINT: train on one rank, or keep training.dtype = \"float32\" with "
                "training.mixed_precision_param = \"bfloat16\" (bf16 matmuls)"));
  }
  at::NoGradGuard no_grad;
  // set_data keeps each parameter's identity (modules holding it see the new dtype).
  for (auto& param : model.parameters()) {
    param.set_data(param.to(dtype));
  }
}

}  // namespace titan
