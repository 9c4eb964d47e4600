// What a FLUX run needs beside its transformer, from the job config, the same way for training,
// `titan flux encode` and `titan generate`: the captions' tokenizers and the frozen encoders.
//   - training.test_mode (TorchTitan's test mode): model.hf_assets_path's tokenizer for both text
//     encoders, framed as TorchTitan's test tokenizer, and random encoders
//     (flux::build_flux_encoders);
//   - otherwise, as TorchTitan loads them: T5's and CLIP's tokenizers and weights from
//     [encoder]'s Hugging Face folders (a T5EncoderModel or a whole T5 whose decoder is left
//     out; a CLIPTextModel or a CLIPModel whose vision tower is left out; a folder without
//     tokenizer files takes them from its diffusers sibling, text_encoder_2 -> tokenizer_2), and
//     the autoencoder from encoder.autoencoder_path (black-forest-labs' ae.safetensors, or a
//     diffusers AutoencoderKL folder).
#pragma once

#include "titan/components/data/image_batches.h"
#include "titan/components/tokenizer/tokenizer.h"
#include "titan/config/job_config.h"
#include "titan/models/flux/conditioner.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <optional>
#include <string>

namespace titan {

struct FluxTokenizers {
  std::unique_ptr<Tokenizer> t5_owned;  // the pretrained encoders' own (null in test mode)
  std::unique_ptr<Tokenizer> clip_owned;
  CaptionTokenizers captions;  // what the image loaders frame captions with
  std::string origin;          // for the log

  flux::CaptionVocab vocab() const;
};

// `test_tokenizer` (model.hf_assets_path's) serves test mode and must outlive the result.
// ConfigError naming the [encoder] key for a folder that is missing or holds no tokenizer.
std::unique_ptr<FluxTokenizers> build_flux_tokenizers(const JobConfig& config,
                                                      const Tokenizer& test_tokenizer);

// The frozen encoders on `device`: random in test mode, else read from [encoder]'s files
// (DataError naming the file for a missing or misshapen weight, ConfigError for encoders that do
// not fit the transformer of `args` or the tokenizers).
flux::FluxEncoders load_flux_encoders(const JobConfig& config, const std::string& flavor,
                                      const flux::FluxArgs& args, const FluxTokenizers& tokenizers,
                                      at::Device device);

// What the captions' encodings depend on (test mode and the tokenizer, or the encoders' paths),
// for the identity of precomputed encodings.
nlohmann::json flux_text_identity(const JobConfig& config);

// A diffusers FLUX pipeline folder (model_index.json naming FluxPipeline, as FLUX.1-dev and
// FLUX.1-schnell are published): its transformer, text encoders, autoencoder and the schedule
// its scheduler asks for.
struct FluxPipelineFolder {
  std::string transformer;  // FluxTransformer2DModel
  // The [encoder] section (test_mode off) that loads text_encoder (CLIP), text_encoder_2 (T5),
  // their tokenizer siblings and vae; max_t5_encoding_len as black-forest-labs' sampler takes
  // for the model (512 with a guidance embedding, 256 without: schnell).
  JobConfig config;
  // FlowMatchEulerDiscreteScheduler with dynamic shifting (flux-dev: black-forest-labs' shifted
  // schedule) or without a shift (flux-schnell).
  bool shift = true;
};

// The pipeline at `dir`, or nullopt when `dir` has no model_index.json. ConfigError for another
// pipeline class, a missing component folder, or a scheduler whose schedule the sampler does not
// draw (the message names the setting).
std::optional<FluxPipelineFolder> read_flux_pipeline(const std::string& dir);

}  // namespace titan
