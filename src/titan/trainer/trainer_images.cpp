// The trainer's image data: image-caption datasets and their loaders, for flow-matching models
// (FLUX: with the frozen encoders that turn a rank's rows into the transformer's batch) and the
// vision-language model (image-text token sequences).
#include "titan/common/check.h"
#include "titan/common/logging.h"
#include "titan/components/data/image_batches.h"
#include "titan/components/data/image_dataset.h"
#include "titan/components/data/image_text_batches.h"
#include "titan/components/tokenizer/tokenizer.h"
#include "titan/models/flux/args.h"
#include "titan/models/vlm/model.h"
#include "titan/trainer/flow_matching.h"
#include "titan/trainer/flux_latents.h"
#include "titan/trainer/trainer.h"

namespace titan {

std::shared_ptr<const ImageCaptionSource> open_image_dataset(const std::string& section,
                                                             const std::string& dataset,
                                                             const std::string& path,
                                                             const TrainingSection& t,
                                                             uint64_t seed) {
  ImageDatasetOptions options;
  options.image_field = t.image_field;
  options.caption_field = t.image_caption_field;
  options.shapes_size = t.img_size;
  options.shapes_seed = seed;
  options.path_key = section + ".dataset_path";
  if (dataset == "shapes") return std::make_shared<ImageCaptionSource>("shapes", options);
  if (path.empty()) {
    throw ConfigError(message(
        "an image model (FLUX, VLM) trains on image-caption data, but ", section, ".dataset is '",
        dataset, "' and ", section, ".dataset_path is empty. HINT: ", section,
        ".dataset = \"shapes\" (the built-in procedural shapes with captions), for FLUX "
        "\"flux_latents\" (the folder `titan flux encode` wrote, at ",
        section, ".dataset_path), or ", section,
        ".dataset_path = a JSON lines / JSON / parquet file or folder of rows with an image and "
        "a caption (training.image_field, training.image_caption_field)"));
  }
  return std::make_shared<ImageCaptionSource>(path, options);
}

int64_t Trainer::sample_tokens() const {
  return flow_ ? flow_->image_tokens() : config_.training.seq_len;
}

void Trainer::check_validation_images_fill_a_batch() const {
  const ValidationSection& v = config_.validation;
  // Found now, not at the first validation after validation.freq training steps.
  if (!make_image_loader("validation", v.local_batch_size * dp_size_, false)->next()) {
    throw ConfigError(message("the validation image dataset has fewer than ",
                              v.local_batch_size * dp_size_,
                              " usable rows, one batch of validation.local_batch_size x the "
                              "data-parallel degree"));
  }
}

void Trainer::build_image_text_data() {
  const TrainingSection& t = config_.training;
  const auto* vlm = dynamic_cast<const vlm::VlmTransformer*>(model_.get());
  TITAN_CHECK(vlm != nullptr, "the vision-language objective needs the vlm model");
  const int64_t patch = vlm->vlm_args().encoder.patch_size;
  TITAN_CONFIG_CHECK(t.patch_size == patch, "training.patch_size = ", t.patch_size,
                     " but the model's encoder cuts patches of ", patch,
                     " pixels. HINT: training.patch_size = ", patch);
  TITAN_CONFIG_CHECK(t.spatial_merge_size == 1,
                     "training.spatial_merge_size = ", t.spatial_merge_size,
                     ": merging patches before the decoder is not built; only 1 is");
  TITAN_CONFIG_CHECK(t.packing_buffer_size == 0,
                     "training.packing_buffer_size = ", t.packing_buffer_size,
                     ": packing several image-text samples into one sequence is not built; "
                     "only 0 (one sample per sequence) is");
  TITAN_CONFIG_CHECK(t.max_images_per_batch >= t.local_batch_size,
                     "training.max_images_per_batch = ", t.max_images_per_batch, " is under the ",
                     t.local_batch_size,
                     " images of a local batch (training.local_batch_size x 1 image per sample). "
                     "HINT: training.max_images_per_batch = ",
                     t.local_batch_size);
  const ImageTokens ids = ImageTokens::after_vocab(*tokenizer_);
  const int64_t vocab = vlm->args().vocab_size;
  TITAN_CONFIG_CHECK(ids.pad < vocab, "the vision-language model's image tokens take ids ",
                     ids.image, "..", ids.pad, " after the tokenizer's ", tokenizer_->vocab_size(),
                     ", beyond flavor '", config_.model.flavor, "''s vocabulary of ", vocab,
                     ". HINT: a tokenizer of at most ", vocab - ids.count(),
                     " tokens, or a flavor with a larger vocab");
  train_images_ = open_image_dataset("training", t.dataset, t.dataset_path, t, /*seed=*/0);
  log_info("image-text dataset ", t.dataset_path.empty() ? t.dataset : t.dataset_path, ": ",
           train_images_->size(), " rows, in order; images of at most ", t.max_patches_per_image,
           " patches of ", patch, " px, captions tokenized by a vocab of ",
           tokenizer_->vocab_size(), " (image tokens ", ids.image, ", ", ids.begin_image, ", ",
           ids.end_image, ", pad ", ids.pad, "), loss on text tokens only");
  train_loader_ = make_image_loader("training", t.local_batch_size * data_dp_size_,
                                    /*infinite=*/true);
  if (config_.validation.enable) {
    const ValidationSection& v = config_.validation;
    validation_images_ = open_image_dataset("validation", v.dataset, v.dataset_path, t, /*seed=*/1);
    log_info("validation image-text dataset ", v.dataset_path.empty() ? v.dataset : v.dataset_path);
    check_validation_images_fill_a_batch();
  }
}

void Trainer::build_image_data() {
  if (spec_->objective == ModelObjective::kVisionLanguage) {
    build_image_text_data();
    return;
  }
  const TrainingSection& t = config_.training;
  flux_tokenizers_ = build_flux_tokenizers(config_, *tokenizer_);
  flow_ = std::make_unique<FlowMatching>(config_, config_.model.flavor,
                                         flux::args_for_flavor(config_.model.flavor),
                                         *flux_tokenizers_, device_, static_cast<uint64_t>(seed_));
  log_info("flow matching: ", flow_->describe(), "; ", flux_tokenizers_->origin);
  if (t.dataset == kFluxLatents) {
    const FluxLatentLoader probe(t.dataset_path, config_, 1, 0.0, 0, false);
    log_info("FLUX encodings ", t.dataset_path, ": ", probe.rows(),
             " samples (the encoders are skipped); classifier-free guidance drop ",
             t.classifier_free_guidance_prob);
  } else {
    train_images_ = open_image_dataset("training", t.dataset, t.dataset_path, t, /*seed=*/0);
    log_info("image dataset ", t.dataset_path.empty() ? t.dataset : t.dataset_path, ": ",
             train_images_->size(), " rows, in order; classifier-free guidance drop ",
             t.classifier_free_guidance_prob);
  }
  train_loader_ = make_image_loader("training", t.local_batch_size * data_dp_size_,
                                    /*infinite=*/true);
  if (config_.validation.enable) {
    const ValidationSection& v = config_.validation;
    // The procedural set's validation images come from another seed than its training ones.
    if (v.dataset != kFluxLatents) {
      validation_images_ =
          open_image_dataset("validation", v.dataset, v.dataset_path, t, /*seed=*/1);
    }
    log_info("validation image dataset ", v.dataset_path.empty() ? v.dataset : v.dataset_path,
             "; stratified timesteps (i + 0.5) / 8");
    check_validation_images_fill_a_batch();
  }
}

std::unique_ptr<BatchLoader> Trainer::make_image_loader(const std::string& section,
                                                        int64_t batch_size, bool infinite) const {
  const TrainingSection& t = config_.training;
  const bool training = section == "training";
  if (spec_->objective == ModelObjective::kVisionLanguage) {
    ImageTextOptions options;
    options.batch_size = batch_size;
    options.seq_len = training ? t.seq_len : config_.validation.seq_len;
    options.patch_size = t.patch_size;
    options.max_patches_per_image = t.max_patches_per_image;
    options.infinite = infinite;
    options.skip_unreadable = t.skip_unreadable_images;
    return std::make_unique<ImageTextBatchLoader>(training ? train_images_ : validation_images_,
                                                  *tokenizer_, options);
  }
  const std::string& dataset = training ? t.dataset : config_.validation.dataset;
  if (dataset == kFluxLatents) {
    return std::make_unique<FluxLatentLoader>(
        training ? t.dataset_path : config_.validation.dataset_path, config_, batch_size,
        training ? t.classifier_free_guidance_prob : 0.0,
        static_cast<uint64_t>(seed_) + (training ? 0 : 1), infinite);
  }
  ImageBatchOptions options;
  options.batch_size = batch_size;
  options.img_size = t.img_size;
  options.t5_tokens = config_.encoder.max_t5_encoding_len;
  options.clip_tokens = 77;  // CLIP's context, as FLUX tokenizes for it
  // Validation scores the conditional model: no captions dropped.
  options.cfg_drop_prob = training ? t.classifier_free_guidance_prob : 0.0;
  options.seed = static_cast<uint64_t>(seed_) + (training ? 0 : 1);
  options.infinite = infinite;
  options.skip_unreadable = t.skip_unreadable_images;
  return std::make_unique<ImageBatchLoader>(training ? train_images_ : validation_images_,
                                            flux_tokenizers_->captions, options);
}

}  // namespace titan
