// The generation loop (see generator.h).
#include "titan/inference/generator.h"

#include "titan/common/check.h"
#include "titan/models/common/attention.h"
#include "titan/models/common/feed_forward.h"
#include "titan/models/common/linear.h"
#include "titan/models/converters.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <sstream>

namespace titan {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// (1, n) int64 tensor of ids[begin, end).
at::Tensor token_tensor(const std::vector<int64_t>& ids, size_t begin, size_t end,
                        const at::Device& device) {
  const std::vector<int64_t> slice(ids.begin() + begin, ids.begin() + end);
  return at::tensor(slice, at::kLong).view({1, -1}).to(device);
}

// The device the model's weights live on (inputs go there).
at::Device model_device(Model& model) {
  const auto params = model.parameters();
  return params.empty() ? at::Device(at::kCPU) : params.front().device();
}

}  // namespace

const char* to_string(StopReason reason) {
  switch (reason) {
    case StopReason::kMaxNewTokens: return "max_new_tokens";
    case StopReason::kEos: return "eos";
    case StopReason::kMaxSeqLen: return "max_seq_len";
  }
  return "?";
}

double GenerationResult::prefill_tokens_per_second() const {
  return prefill_seconds > 0 ? static_cast<double>(n_prompt) / prefill_seconds : 0.0;
}

double GenerationResult::decode_tokens_per_second() const {
  return decode_seconds > 0 ? static_cast<double>(n_generated - 1) / decode_seconds : 0.0;
}

GenerationResult generate(Model& model, const std::vector<int64_t>& prompt,
                          const GenerationOptions& options,
                          const std::function<void(int64_t)>& on_token) {
  const auto n_prompt = static_cast<int64_t>(prompt.size());
  if (n_prompt == 0) {
    throw ConfigError("the prompt has no tokens");
  }
  if (n_prompt >= options.max_seq_len) {
    std::ostringstream os;
    os << "the prompt has " << n_prompt << " tokens, max_seq_len is " << options.max_seq_len
       << ": no room to generate. HINT: raise --max_seq_len or shorten the prompt";
    throw ConfigError(os.str());
  }
  if (options.max_new_tokens < 0) {
    throw ConfigError(message("--max_new_tokens must be >= 0, got ", options.max_new_tokens));
  }
  Sampler sampler(options.sampler);
  // Inference mode, not just no-grad: the tensors made here (cache, activations, logits) carry
  // no version counters or view tracking, which takes autograd's dispatch off every op of a
  // decode step (single-token steps are short enough for that to show).
  c10::InferenceMode inference_mode;
  const at::Device device = model_device(model);
  // The cache never needs more than the sequence can grow to.
  // (n_prompt < max_seq_len, so the sum cannot overflow once max_new_tokens is capped by it.)
  KVCache cache(std::min(options.max_seq_len,
                         n_prompt + std::min(options.max_new_tokens, options.max_seq_len)));

  GenerationResult result;
  result.tokens = prompt;
  result.n_prompt = n_prompt;
  const Clock::time_point start = Clock::now();
  Clock::time_point decode_start = start;
  while (result.n_generated < options.max_new_tokens) {
    const auto length = static_cast<int64_t>(result.tokens.size());
    if (length >= options.max_seq_len) {
      result.stop_reason = StopReason::kMaxSeqLen;
      break;
    }
    at::Tensor logits;  // (1, n, vocab) for the positions just run
    if (options.use_kv_cache) {
      // The first step feeds the whole prompt (prefill); later ones the newest token only.
      const int64_t start_pos = cache.length;
      const at::Tensor tokens =
          token_tensor(result.tokens, static_cast<size_t>(start_pos), result.tokens.size(), device);
      logits = start_pos == 0 && !options.conditioning.empty()
                   ? model.prefill_cached(tokens, options.conditioning, cache)
                   : model.forward_cached(tokens, cache, start_pos);
    } else {
      ForwardInputs inputs;
      for (const auto& [key, value] : options.conditioning) {
        const bool per_token = value.dim() == 2 && value.size(0) == 1 && value.size(1) == n_prompt;
        inputs.conditioning[key] =
            per_token ? at::constant_pad_nd(value, {0, length - n_prompt}, 0) : value;
      }
      logits = model.forward(token_tensor(result.tokens, 0, result.tokens.size(), device), inputs);
    }
    at::Tensor last = logits[0][-1];  // (vocab)
    if (options.vocab_limit > 0 && options.vocab_limit < last.size(0)) {
      last = last.narrow(0, 0, options.vocab_limit);
    }
    int64_t id = 0;
    try {
      id = sampler.sample(last);
    } catch (const DataError& e) {
      throw DataError("generated token " + std::to_string(result.n_generated + 1) + ": " +
                      e.what());
    }
    result.tokens.push_back(id);
    ++result.n_generated;
    if (result.n_generated == 1) {
      result.prefill_seconds = seconds_since(start);
      decode_start = Clock::now();
    }
    if (on_token) {
      on_token(id);
    }
    if (id == options.eos_id) {
      result.stop_reason = StopReason::kEos;
      break;
    }
  }
  if (result.n_generated > 1) {
    result.decode_seconds = seconds_since(decode_start);
  }
  return result;
}

void cast_parameters_for_inference(Model& model, at::ScalarType dtype) {
  if (!is_reduced_float(dtype)) {
    return;
  }
  at::NoGradGuard no_grad;
  for (at::Tensor& param : model.parameters()) {
    if (at::isFloatingType(param.scalar_type())) {
      param.set_data(param.to(dtype));
    }
  }
}

InferencePreparation prepare_for_inference(Model& model) {
  InferencePreparation out;
  for (const auto& m : model.modules(/*include_self=*/true)) {
    if (auto* a = dynamic_cast<Attention*>(m.get())) {
      out.packed += a->packed_qkv.pack({a->wq.get(), a->wk.get(), a->wv.get()}) ? 1 : 0;
    }
    if (auto* f = dynamic_cast<FeedForward*>(m.get())) {
      out.packed += f->packed_w13.pack({f->w1.get(), f->w3.get()}) ? 1 : 0;
    }
  }
  const FusedLayers fused = enable_fused_layers(model);
  out.fused = fused.norms + fused.ffns + fused.ropes;
  return out;
}

}  // namespace titan
