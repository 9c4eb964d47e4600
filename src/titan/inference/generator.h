// Autoregressive generation: prefill the prompt, then decode one token at a time until
// max_new_tokens, the EOS token, or the longest sequence the model was built for. With the KV
// cache each decode step runs the model on the newest token only; without it the whole
// sequence is re-run every step, which is slow but independent of the cache, so the two can be
// compared (greedy decoding must give the same tokens).
#pragma once

#include "titan/inference/sampler.h"
#include "titan/models/model.h"

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace titan {

struct GenerationOptions {
  int64_t max_new_tokens = 128;  // tokens to generate at most
  int64_t max_seq_len = 2048;    // longest sequence (prompt + generated); the model's RoPE length
  bool use_kv_cache = true;      // false: full forward over the whole sequence each step
  int64_t eos_id = -1;           // generation stops after producing it; < 0: never
  int64_t vocab_limit = 0;       // > 0: only ids [0, vocab_limit) may be produced (a tokenizer
                                 // smaller than the model's embedding cannot decode the rest)
  SamplerOptions sampler;
  // What the prompt comes with (ForwardInputs::conditioning: a vision-language model's images).
  // The cached path hands it to Model::prefill_cached; the uncached one to every forward, with
  // per-token entries (shape (1, prompt length)) extended by zeros over the generated tokens.
  std::map<std::string, at::Tensor> conditioning;
};

enum class StopReason { kMaxNewTokens, kEos, kMaxSeqLen };

// "max_new_tokens", "eos", "max_seq_len"
const char* to_string(StopReason reason);

struct GenerationResult {
  std::vector<int64_t> tokens;  // the prompt followed by the generated ids (EOS included)
  int64_t n_prompt = 0;
  int64_t n_generated = 0;
  StopReason stop_reason = StopReason::kMaxNewTokens;
  // The first step (forward over the prompt, first token) and all later steps, in seconds.
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;

  double prefill_tokens_per_second() const;  // prompt tokens per second of prefill
  double decode_tokens_per_second() const;   // tokens after the first per second of decode
};

// Generates a continuation of `prompt` (non-empty, shorter than options.max_seq_len: else
// ConfigError) with batch size 1. `on_token`, if set, sees each new id as soon as it is chosen
// (for streaming). Runs without autograd.
GenerationResult generate(Model& model, const std::vector<int64_t>& prompt,
                          const GenerationOptions& options,
                          const std::function<void(int64_t)>& on_token = {});

// Casts the model's floating-point parameters (not its buffers, e.g. the float32 RoPE tables) to
// `dtype` when it is a 16-bit type, so that inference does not re-cast every float32 master
// weight on every step as mixed-precision training does. Irreversible; inference only.
void cast_parameters_for_inference(Model& model, at::ScalarType dtype);

// What prepare_for_inference changed.
struct InferencePreparation {
  int64_t packed = 0;  // groups of projections packed into one matrix
  int64_t fused = 0;   // RMSNorm, SwiGLU and RoPE layers switched to the fused CPU kernels
};

// Readies a model whose parameters are final (cast, on their device) for generation: the
// projections that read one input (attention's wq, wk, wv; the feed-forward's w1, w3) become one
// matrix each (PackedLinear: a decode step runs two matrix-vector products where it ran five),
// and the layers take titan's fused CPU kernels where they measured faster (enable_fused_layers,
// as compile.enable does in training; other devices keep ATen's ops).
// The values computed are the same up to float rounding. Irreversible; inference only.
InferencePreparation prepare_for_inference(Model& model);

}  // namespace titan
