// ModelStats arithmetic, whole-model init, the unit-runner chain and the pipeline-stage checks
// shared by every model.
#include "titan/models/model.h"

#include "titan/models/registry.h"

#include <algorithm>
#include <map>
#include <set>

namespace titan {

namespace {

// Runs runners[0, depth) around fn, the one at depth - 1 outermost. Each `next` owns copies of
// what it calls, so a runner may keep it and call it again after this returns.
at::Tensor run_chain(const std::vector<UnitRunner*>& runners, size_t depth, int64_t index,
                     const at::Tensor& input, const UnitFn& fn) {
  if (depth == 0) return fn(input);
  UnitRunner* runner = runners[depth - 1];
  if (depth == 1) return runner->run(index, input, fn);
  const UnitFn next = [runners, depth, index, fn](const at::Tensor& x) {
    return run_chain(runners, depth - 1, index, x, fn);
  };
  return runner->run(index, input, next);
}

}  // namespace

void Model::add_unit_runner(UnitRunner* runner) {
  TITAN_CHECK(runner != nullptr, "add_unit_runner: null runner");
  TITAN_CHECK(std::find(runners_.begin(), runners_.end(), runner) == runners_.end(),
              "add_unit_runner: this runner is already installed");
  runners_.push_back(runner);
}

void Model::remove_unit_runner(UnitRunner* runner) {
  runners_.erase(std::remove(runners_.begin(), runners_.end(), runner), runners_.end());
}

void Model::init_weights(uint64_t seed) {
  for (auto& item : named_parameters()) {
    init_whole(item.value(), initial_value(item.key()), seed, item.key());
  }
}

at::Tensor Model::prefill_cached(const at::Tensor& tokens,
                                 const std::map<std::string, at::Tensor>& conditioning,
                                 KVCache& cache) {
  if (!conditioning.empty()) {
    throw ConfigError(message("this model takes no conditioning with its prompt, but '",
                              conditioning.begin()->first,
                              "' was given. HINT: images go with a vision-language model "
                              "(model.name = \"vlm\")"));
  }
  return forward_cached(tokens, cache, /*start_pos=*/0);
}

ParamInit Model::initial_value(const std::string& name) const {
  const auto it = added_inits_.find(name);
  return it != added_inits_.end() ? it->second : param_init(name);
}

void Model::keep_only(const std::vector<std::string>& modules) {
  TITAN_CHECK(unit_runners().empty(),
              "keep_only after parallelize. HINT: split the model into pipeline stages first, "
              "then parallelize each stage");
  const std::vector<std::string> present = stage_modules();
  if (present.empty()) {
    throw ConfigError(
        "this model does not support pipeline parallelism (it cannot keep only some of its "
        "modules). HINT: set parallelism.pipeline_parallel_degree = 1");
  }
  std::map<std::string, size_t> position;
  for (size_t i = 0; i < present.size(); ++i) position[present[i]] = i;

  if (modules.empty()) throw ConfigError("pipeline stage: the module list is empty");
  std::set<std::string> seen;
  for (size_t k = 0; k < modules.size(); ++k) {
    const std::string& name = modules[k];
    if (!seen.insert(name).second) {
      throw ConfigError(message("pipeline stage: module '", name, "' is listed twice"));
    }
    if (position.count(name) == 0) {
      throw ConfigError(message("pipeline stage: no module '", name, "' in this model",
                                suggestion(name, present, "modules")));
    }
    if (k == 0) continue;
    const std::string& prev = modules[k - 1];
    if (position[name] < position[prev]) {
      throw ConfigError(
          message("pipeline stage: '", name, "' is listed after '", prev,
                  "' but comes before it in the model. HINT: list a stage's modules in "
                  "model order (",
                  present.front(), ", ..., ", present.back(), ")"));
    }
    if (position[name] != position[prev] + 1) {
      throw ConfigError(message("pipeline stage: '", prev, "' is followed by '", name,
                                "', skipping '", present[position[prev] + 1],
                                "'. HINT: a stage holds a contiguous run of modules"));
    }
  }
  keep_modules(seen);
}

at::Tensor Model::forward(const at::Tensor& tokens, const ForwardInputs& inputs) {
  for (UnitRunner* runner : runners_) runner->begin_forward();
  at::Tensor out = run_forward(tokens, inputs);
  for (UnitRunner* runner : runners_) runner->end_forward();
  return out;
}

at::Tensor Model::run_unit(int64_t index, const at::Tensor& input, const UnitFn& fn) const {
  return run_chain(runners_, runners_.size(), index, input, fn);
}

double ModelStats::flops_per_token(int64_t seq_len) const {
  // 6 FLOPs per parameter per token (forward 2, backward 4), embeddings excluded as lookups; plus
  // the attention matmuls (scores and weighted sum), 12 per head dimension per key position.
  const double window_keys = static_cast<double>(std::min(seq_len, attention_window));
  const double keys = static_cast<double>(n_layers + n_mtp_layers - n_window_layers) *
                          static_cast<double>(seq_len) +
                      static_cast<double>(n_window_layers) * window_keys;
  const double mtp_heads = static_cast<double>(n_mtp_layers) * static_cast<double>(dim) *
                           static_cast<double>(vocab_size);
  return 6.0 * (static_cast<double>(active_params() - n_embedding_params) + mtp_heads) +
         12.0 * static_cast<double>(n_heads) * static_cast<double>(head_dim) * keys;
}

}  // namespace titan
