// MoE arguments: validation and names (see moe.h). Apart from the layer so that code that only
// reads model descriptions (config parsers, their fuzzers) links without the modules.
#include "titan/models/common/moe.h"

#include "titan/common/check.h"

#include <string>

namespace titan {
namespace {

std::string num(int64_t v) { return std::to_string(v); }

}  // namespace

void MoEArgs::validate() const {
  // Far above real models (DeepSeek-V3: 256 experts of 2048), low enough that parameter counts
  // cannot overflow int64 (model descriptions come from files).
  if (num_experts > (int64_t{1} << 16) || hidden_dim > (int64_t{1} << 24) ||
      num_shared_experts > (int64_t{1} << 10)) {
    throw ConfigError(message("MoE: num_experts ", num(num_experts), ", hidden_dim ",
                              num(hidden_dim), " or num_shared_experts ", num(num_shared_experts),
                              " is out of range (at most 65536, 16777216 and 1024)"));
  }
  if (shared_expert_gate && num_shared_experts < 1) {
    throw ConfigError("MoE: shared_expert_gate gates the shared experts; num_shared_experts is 0");
  }
  if (num_experts < 1)
    throw ConfigError(message("MoE: num_experts must be >= 1, got ", num(num_experts)));
  if (top_k < 1 || top_k > num_experts) {
    throw ConfigError(message("MoE: top_k ", num(top_k),
                              " must be in [1, num_experts = ", num(num_experts), "]"));
  }
  if (hidden_dim < 1)
    throw ConfigError(message("MoE: hidden_dim must be >= 1, got ", num(hidden_dim)));
  if (num_shared_experts < 0) {
    throw ConfigError(
        message("MoE: num_shared_experts must be >= 0, got ", num(num_shared_experts)));
  }
  if (num_expert_groups > 0) {
    if (num_experts % num_expert_groups != 0) {
      throw ConfigError(message("MoE: num_experts ", num(num_experts), " is not divisible by ",
                                "num_expert_groups ", num(num_expert_groups), " (",
                                num(num_experts), " % ", num(num_expert_groups), " = ",
                                num(num_experts % num_expert_groups), ")"));
    }
    const int64_t per_group = num_experts / num_expert_groups;
    if (num_limited_groups < 1 || num_limited_groups > num_expert_groups) {
      throw ConfigError(message("MoE: num_limited_groups ", num(num_limited_groups),
                                " must be in [1, num_expert_groups = ", num(num_expert_groups),
                                "]"));
    }
    if (top_k > num_limited_groups * per_group) {
      throw ConfigError(message("MoE: top_k ", num(top_k), " exceeds the experts of the ",
                                num(num_limited_groups), " groups a token may use (",
                                num(num_limited_groups), " x ", num(per_group), " = ",
                                num(num_limited_groups * per_group), ")"));
    }
    if (score_func == Score::kSigmoid && per_group < 2) {
      throw ConfigError(
          message("MoE: sigmoid group scores sum each group's two best experts; groups of ",
                  num(per_group), " expert are too small"));
    }
  }
  if (!(swiglu_limit >= 0) || !(swiglu_alpha > 0) || swiglu_limit > 1e6 || swiglu_alpha > 1e6) {
    throw ConfigError(message("MoE: swiglu_limit ", swiglu_limit, " must be >= 0 (0: plain SwiGLU)",
                              " and swiglu_alpha ", swiglu_alpha, " > 0, both at most 1e6"));
  }
  if (load_balance_coeff < 0) {
    throw ConfigError(message("MoE: load_balance_coeff must be >= 0, got ", load_balance_coeff));
  }
}

MoEArgs::Score parse_moe_score(const std::string& name) {
  if (name == "softmax") return MoEArgs::Score::kSoftmax;
  if (name == "sigmoid") return MoEArgs::Score::kSigmoid;
  throw ConfigError(message("unknown MoE score function '", name, "' (it is softmax or sigmoid)"));
}

}  // namespace titan
