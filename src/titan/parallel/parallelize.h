// The parallelize functions (TorchTitan's parallelize_fn), by model name: parallel/ owns them, and
// models only declare data (tensor_parallel_plan(), units(), tp_split_counts()). Every model
// registered today is a decoder whose plan is that data, so parallelize_decoder serves them all; a
// model that needs another order registers its own function here.
#pragma once

#include "titan/distributed/parallel_dims.h"
#include "titan/models/model.h"
#include "titan/parallel/parallelized_model.h"

#include <functional>
#include <memory>
#include <string>

namespace titan {

using ParallelizeFn = std::function<std::unique_ptr<ParallelizedModel>(
    std::shared_ptr<Model> model, const ParallelDims& dims, int64_t rank,
    const ParallelizeOptions& options)>;

// The generic decoder parallelize (the order in parallelized_model.h), for models whose plan is
// their tensor_parallel_plan(), units() and tp_split_counts().
std::unique_ptr<ParallelizedModel> parallelize_decoder(std::shared_ptr<Model> model,
                                                       const ParallelDims& dims, int64_t rank,
                                                       const ParallelizeOptions& options);

// Registers `fn` as the parallelize function of model `name` (replacing parallelize_decoder).
void register_parallelize(const std::string& name, ParallelizeFn fn);
// The parallelize function of model `name`: its registered one, else parallelize_decoder.
ParallelizeFn parallelize_fn(const std::string& name);

}  // namespace titan
