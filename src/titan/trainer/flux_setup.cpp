// FLUX's tokenizers and frozen encoders from the job config (see flux_setup.h).
#include "titan/trainer/flux_setup.h"

#include "titan/checkpoint/hf_folder.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/common/check.h"
#include "titan/components/tokenizer/tokenizer_files.h"
#include "titan/models/encoders/load.h"

#include <filesystem>
#include <sstream>

namespace titan {
namespace {

namespace fs = std::filesystem;

constexpr const char* kTestModeHint =
    " HINT: training.test_mode = true trains with random encoders and captions tokenized by "
    "model.hf_assets_path (TorchTitan's test mode)";

// The folder of a pretrained component, or ConfigError naming its key.
void check_folder(const std::string& key, const std::string& path, const std::string& holds) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    throw ConfigError(message(key, ": '", path, "' is not a folder; point it at a Hugging Face ",
                              "folder holding ", holds, ".", kTestModeHint));
  }
}

// The tokenizer of an encoder folder: its own files, else its diffusers sibling's
// (text_encoder -> tokenizer, text_encoder_2 -> tokenizer_2).
std::unique_ptr<Tokenizer> encoder_tokenizer(const std::string& key, const std::string& folder) {
  fs::path dir = fs::path(folder);
  if (!dir.has_filename()) dir = dir.parent_path();  // a trailing '/'
  std::string name = dir.filename().string();
  std::string sibling;
  if (name.rfind("text_encoder", 0) == 0) {
    sibling = (dir.parent_path() / ("tokenizer" + name.substr(12))).string();
  }
  for (const std::string& candidate : {folder, sibling}) {
    if (!candidate.empty() && !ckpt::hf_tokenizer_path(candidate).empty()) {
      return load_tokenizer(candidate);
    }
  }
  throw ConfigError(message(key, ": '", folder, "' holds no tokenizer (tokenizer.json, ",
                            "spiece.model, or vocab.json + merges.txt)",
                            sibling.empty() ? "" : ", nor does its sibling " + sibling, ".",
                            kTestModeHint));
}

// The tensors of `reader` whose names pass `keep`.
template <class Keep>
TensorMap read_kept(const ckpt::HfFolderReader& reader, Keep keep) {
  TensorMap out;
  for (const std::string& name : reader.names()) {
    if (keep(name)) out[name] = reader.read(name).to(at::kFloat);
  }
  return out;
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

flux::CaptionVocab FluxTokenizers::vocab() const {
  return {captions.t5->vocab_size(), captions.clip->vocab_size(), captions.clip->eos_id()};
}

std::unique_ptr<FluxTokenizers> build_flux_tokenizers(const JobConfig& config,
                                                      const Tokenizer& test_tokenizer) {
  auto out = std::make_unique<FluxTokenizers>();
  if (config.training.test_mode) {
    out->captions = CaptionTokenizers::shared_test(test_tokenizer);
    out->origin =
        message("captions tokenized by ", config.model.hf_assets_path,
                " for both encoders (training.test_mode), vocab ", test_tokenizer.vocab_size());
    return out;
  }
  const EncoderSection& e = config.encoder;
  check_folder("encoder.t5_encoder", e.t5_encoder, "T5's weights and tokenizer");
  check_folder("encoder.clip_encoder", e.clip_encoder, "CLIP's weights and tokenizer");
  out->t5_owned = encoder_tokenizer("encoder.t5_encoder", e.t5_encoder);
  out->clip_owned = encoder_tokenizer("encoder.clip_encoder", e.clip_encoder);
  // Both frame captions with these ids: ConfigError now rather than at the first batch.
  out->t5_owned->eos_id();
  out->clip_owned->bos_id();
  out->clip_owned->eos_id();
  out->captions = {out->t5_owned.get(), out->clip_owned.get(), /*pretrained=*/true};
  out->origin = message("captions tokenized by T5's tokenizer (vocab ", out->t5_owned->vocab_size(),
                        ") and CLIP's (vocab ", out->clip_owned->vocab_size(), ")");
  return out;
}

flux::FluxEncoders load_flux_encoders(const JobConfig& config, const std::string& flavor,
                                      const flux::FluxArgs& args, const FluxTokenizers& tokenizers,
                                      at::Device device) {
  if (config.training.test_mode) {
    return flux::build_flux_encoders(config, flavor, args, tokenizers.vocab(), device);
  }
  const EncoderSection& e = config.encoder;
  flux::FluxEncoders out;
  {
    const ckpt::HfFolderReader reader(e.t5_encoder);
    out.t5 = std::make_shared<encoders::T5Encoder>(encoders::t5_args_from_hf(reader.config()));
    // A whole T5 (T5ForConditionalGeneration) also holds its decoder: left out, as
    // T5EncoderModel.from_pretrained does.
    encoders::load_named_tensors(
        *out.t5,
        read_kept(reader,
                  [](const std::string& n) {
                    return n == "shared.weight" || starts_with(n, "encoder.");
                  }),
        "T5 encoder " + e.t5_encoder, {{"shared.weight", "encoder.embed_tokens.weight"}});
  }
  {
    const ckpt::HfFolderReader reader(e.clip_encoder);
    out.clip = std::make_shared<encoders::ClipTextEncoder>(
        encoders::clip_text_args_from_hf(reader.config()));
    // A CLIPModel's vision tower and projections are left out (CLIPTextModel.from_pretrained).
    const bool whole_clip = reader.config().contains("text_config");
    encoders::load_named_tensors(
        *out.clip,
        encoders::clip_text_tensors_from_hf(read_kept(
            reader,
            [&](const std::string& n) { return !whole_clip || starts_with(n, "text_model."); })),
        "CLIP text encoder " + e.clip_encoder);
  }
  std::error_code ec;
  const std::string& ae_path = e.autoencoder_path;
  if (fs::is_directory(ae_path, ec)) {
    const ckpt::HfFolderReader reader(ae_path);
    const flux::AutoEncoderArgs ae_args = flux::ae_args_from_diffusers(reader.config());
    out.autoencoder = std::make_shared<flux::AutoEncoder>(ae_args);
    encoders::load_named_tensors(*out.autoencoder,
                                 flux::ae_from_diffusers(reader.read_all(), ae_args),
                                 "autoencoder " + ae_path);
  } else if (fs::is_regular_file(ae_path, ec)) {
    const ckpt::SafetensorsReader file(ae_path);
    TensorMap tensors;
    for (const auto& entry : file.entries()) {
      tensors[entry.name] = file.read(entry.name).to(at::kFloat);
    }
    out.autoencoder =
        std::make_shared<flux::AutoEncoder>(flux::autoencoder_args_for_flavor(flavor));
    encoders::load_named_tensors(*out.autoencoder, tensors, "autoencoder " + ae_path);
  } else {
    throw ConfigError(message("encoder.autoencoder_path: '", ae_path,
                              "' does not exist; point it at black-forest-labs' ae.safetensors or ",
                              "a diffusers AutoencoderKL folder.", kTestModeHint));
  }
  flux::finish_flux_encoders(out, args, tokenizers.vocab(), device);
  out.origin = message("T5 from ", e.t5_encoder, ", CLIP from ", e.clip_encoder,
                       ", autoencoder from ", ae_path);
  return out;
}

nlohmann::json flux_text_identity(const JobConfig& config) {
  if (config.training.test_mode) {
    return {{"test_mode", true}, {"tokenizer", config.model.hf_assets_path}};
  }
  return {{"test_mode", false},
          {"t5_encoder", config.encoder.t5_encoder},
          {"clip_encoder", config.encoder.clip_encoder},
          {"autoencoder_path", config.encoder.autoencoder_path}};
}

std::optional<FluxPipelineFolder> read_flux_pipeline(const std::string& dir) {
  const fs::path root(dir);
  std::error_code ec;
  if (!fs::is_regular_file(root / "model_index.json", ec)) return std::nullopt;
  const nlohmann::json index = ckpt::read_hf_json(root / "model_index.json");
  const std::string kind = index.is_object() ? index.value("_class_name", std::string()) : "";
  if (kind != "FluxPipeline") {
    throw ConfigError(
        message("'", dir, "' is a diffusers ", kind.empty() ? std::string("(unnamed)") : kind,
                " pipeline; titan samples from FluxPipeline folders (FLUX.1-dev, FLUX.1-schnell)"));
  }
  FluxPipelineFolder out;
  const auto component = [&](const std::string& name) {
    const fs::path path = root / name;
    if (!fs::is_directory(path, ec)) {
      throw ConfigError(message("the FluxPipeline folder '", dir, "' has no ", name,
                                " folder (model_index.json lists the pipeline's parts: "
                                "transformer, text_encoder, tokenizer, text_encoder_2, "
                                "tokenizer_2, vae, scheduler)"));
    }
    return path.string();
  };
  out.transformer = component("transformer");
  out.config.training.test_mode = false;
  out.config.encoder.clip_encoder = component("text_encoder");
  out.config.encoder.t5_encoder = component("text_encoder_2");
  out.config.encoder.autoencoder_path = component("vae");
  const nlohmann::json transformer = ckpt::read_hf_json(fs::path(out.transformer) / "config.json");
  const bool guidance = transformer.is_object() && transformer.value("guidance_embeds", false);
  out.config.encoder.max_t5_encoding_len = guidance ? 512 : 256;
  out.shift = guidance;
  const fs::path scheduler = root / "scheduler" / "scheduler_config.json";
  if (!fs::is_regular_file(scheduler, ec)) return out;
  const nlohmann::json s = ckpt::read_hf_json(scheduler);
  const std::string where = scheduler.string();
  const std::string cls = s.is_object() ? s.value("_class_name", std::string()) : "";
  TITAN_CONFIG_CHECK(cls == "FlowMatchEulerDiscreteScheduler", where, ": the scheduler is ",
                     cls.empty() ? std::string("unnamed") : cls,
                     "; titan's sampler is FlowMatchEulerDiscreteScheduler's Euler steps");
  const auto number = [&](const char* key, double fallback) {
    const auto it = s.find(key);
    return it != s.end() && it->is_number() ? it->get<double>() : fallback;
  };
  const auto flag = [&](const char* key) {
    const auto it = s.find(key);
    return it != s.end() && it->is_boolean() && it->get<bool>();
  };
  for (const char* key : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas",
                          "invert_sigmas", "stochastic_sampling"}) {
    TITAN_CONFIG_CHECK(!flag(key), where, ": ", key,
                       " = true is a schedule titan's sampler does not draw");
  }
  TITAN_CONFIG_CHECK(s.value("time_shift_type", std::string("exponential")) == "exponential", where,
                     ": time_shift_type must be \"exponential\" (black-forest-labs')");
  TITAN_CONFIG_CHECK(number("shift_terminal", 0.0) == 0.0, where,
                     ": shift_terminal is not drawn by titan's sampler");
  out.shift = flag("use_dynamic_shifting");
  if (out.shift) {
    // black-forest-labs' line through (256 tokens, 0.5) and (4096 tokens, 1.15).
    TITAN_CONFIG_CHECK(
        number("base_image_seq_len", 256) == 256 && number("max_image_seq_len", 4096) == 4096 &&
            number("base_shift", 0.5) == 0.5 && number("max_shift", 1.15) == 1.15,
        where, ": dynamic shifting through (base_image_seq_len, base_shift) = (",
        number("base_image_seq_len", 256), ", ", number("base_shift", 0.5),
        ") and (max_image_seq_len, max_shift) = (", number("max_image_seq_len", 4096), ", ",
        number("max_shift", 1.15), "); titan's sampler draws FLUX.1's (256, 0.5) and (4096, 1.15)");
  } else {
    TITAN_CONFIG_CHECK(number("shift", 1.0) == 1.0, where, ": a static shift of ",
                       number("shift", 1.0),
                       "; titan's sampler draws FLUX.1's dynamic shift or none (shift 1.0)");
  }
  return out;
}

}  // namespace titan
