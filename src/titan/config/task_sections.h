// Sections of the job config (job_config.h) that serve one kind of task: [encoder] (FLUX's
// frozen encoders), [sft] (chat fine-tuning) and [lora] (low-rank adapters).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace titan {

// [encoder]: FLUX's frozen encoders (TorchTitan's flux job config).
struct EncoderSection {
  static constexpr const char* kName = "encoder";
  std::string t5_encoder = "google/t5-v1_1-small";
  std::string clip_encoder = "openai/clip-vit-large-patch14";
  std::string autoencoder_path = "torchtitan/experiments/flux/assets/autoencoder/ae.safetensors";
  int64_t max_t5_encoding_len = 256;

  template <class V>
  void visit(V& v) {
    v("t5_encoder", t5_encoder,
      "FLUX: the T5 text encoder, a local Hugging Face folder (config.json, *.safetensors, and "
      "its tokenizer here or in a diffusers tokenizer_2 sibling); under training.test_mode only "
      "its config.json is read, if it exists");
    v("clip_encoder", clip_encoder,
      "FLUX: the CLIP text encoder, a local Hugging Face folder (a CLIPTextModel or CLIPModel, "
      "with its tokenizer); under training.test_mode only its config.json is read, if it exists");
    v("autoencoder_path", autoencoder_path,
      "FLUX: the autoencoder's weights, black-forest-labs' ae.safetensors or a diffusers "
      "AutoencoderKL folder; unused under training.test_mode");
    v("max_t5_encoding_len", max_t5_encoding_len,
      "FLUX: text tokens per caption given to T5 (padded or cut to it); >= 1");
  }
};

// [sft]: chat fine-tuning, used when training.dataset (or validation.dataset) is "chat". A titan
// section: TorchTitan's chat SFT came after v0.2.2, with Python configuration.
struct SftSection {
  static constexpr const char* kName = "sft";
  std::string messages_field = "messages";
  std::string prompt_field = "";
  std::string response_field = "";
  std::string system_prompt = "";
  std::string chat_template = "";
  std::string overlong = "drop";

  template <class V>
  void visit(V& v) {
    v("messages_field", messages_field,
      "Field of a chat row holding its conversation: a list of {role, content} messages");
    v("prompt_field", prompt_field,
      "Question/answer rows: the field holding the user's message (with sft.response_field; "
      "then messages_field is unused)");
    v("response_field", response_field,
      "Question/answer rows: the field holding the assistant's reply");
    v("system_prompt", system_prompt,
      "System message put first in conversations that have none; empty: none");
    v("chat_template", chat_template,
      "A Jinja chat template file used instead of the one in model.hf_assets_path; empty: the "
      "tokenizer folder's (chat_template.jinja, tokenizer_config.json)");
    v("overlong", overlong,
      "Conversations longer than training.seq_len: drop, or truncate (both counted in the log)");
  }
};

// [lora]: low-rank adapters (models/lora.h), applied when model.converters lists "lora". A titan
// section: TorchTitan's LoRA came after v0.2.2, as an experiment configured the same way.
struct LoraSection {
  static constexpr const char* kName = "lora";
  int64_t rank = 8;
  double alpha = 16.0;
  double dropout = 0.0;
  std::vector<std::string> target_modules = {"wq", "wv"};
  bool use_rslora = false;
  std::string quantize_base;

  template <class V>
  void visit(V& v) {
    v("rank", rank, "Rank r of each adapter: lora_a is (r, in_features), lora_b (out_features, r)");
    v("alpha", alpha,
      "Scale of the adapters' output: alpha / rank (alpha / sqrt(rank) with "
      "use_rslora)");
    v("dropout", dropout, "Dropout on the adapters' input while training (0: none)");
    v("target_modules", target_modules,
      "Linear layers that get adapters, by the last part of their name, ours (wq, wk, wv, wo, w1, "
      "w2, w3, ...) or Hugging Face's (q_proj, v_proj, gate_proj, ...); \"all-linear\": every "
      "linear layer of the transformer blocks; the routed experts of MoE layers only by name: "
      "\"experts\", or PEFT's experts.gate_up_proj / experts.down_proj");
    v("use_rslora", use_rslora, "Rank-stabilized LoRA: scale by alpha / sqrt(rank)");
    v("quantize_base", quantize_base,
      "QLoRA: \"nf4\" holds the frozen linear weights of the transformer blocks in 4-bit NF4 "
      "(blocks of 64, double-quantized scales), read from checkpoint.initial_load_path (a "
      "Hugging Face folder); \"\": in the training dtype");
  }
};

}  // namespace titan
