// The trainer's token data (trainer.h): the datasets and loaders of build_data, each rank's slice
// of a global batch, and validation. Image data for flow-matching models is trainer_images.cpp's.
#include "titan/trainer/trainer.h"

#include "titan/common/check.h"
#include "titan/common/device.h"
#include "titan/common/file_io.h"
#include "titan/common/format.h"
#include "titan/common/host_sync.h"
#include "titan/common/logging.h"
#include "titan/common/phase.h"
#include "titan/components/data/data_loader.h"
#include "titan/components/data/dataset.h"
#include "titan/components/data/record_source.h"
#include "titan/components/data/sft_data.h"
#include "titan/components/tokenizer/chat_config.h"
#include "titan/components/tokenizer/chat_template.h"
#include "titan/components/tokenizer/tokenizer.h"
#include "titan/components/tokenizer/tokenizer_identity.h"
#include "titan/distributed/parallel_dims.h"
#include "titan/kernels/cross_entropy.h"
#include "titan/parallel/parallelized_model.h"
#include "titan/trainer/flow_matching.h"

#include <string>
#include <utility>

namespace titan {

namespace {

// The validation set cannot fill one batch of validation.local_batch_size x (seq_len + 1) tokens
// over the data-parallel ranks.
[[noreturn]] void throw_validation_too_small(const ValidationSection& v, int64_t dp_size) {
  throw ConfigError(
      message("validation set '", v.dataset, "' yields no full batch of ", v.local_batch_size,
              " x ", v.seq_len + 1, " tokens",
              (dp_size > 1 ? " on each of " + std::to_string(dp_size) + " data-parallel ranks"
                           : std::string()),
              ". HINT: lower validation.local_batch_size or validation.seq_len, or use a "
              "larger validation set (validation.dataset_path)"));
}

}  // namespace

void Trainer::build_data() {
  if (spec_->objective != ModelObjective::kNextToken) {
    build_image_data();
    return;
  }
  const ModelStats stats = model_->stats(1, config_.training.seq_len);
  check_tokenizer_fits_model(*tokenizer_, stats.vocab_size, "flavor '" + config_.model.flavor + "'",
                             "pick a flavor with a larger vocab");
  const auto& t = config_.training;
  const bool chat = t.dataset == kChatDataset;
  const bool validate_chat =
      config_.validation.enable && config_.validation.dataset == kChatDataset;
  if (chat || validate_chat) {
    const SftSection& sft = config_.sft;
    TITAN_CONFIG_CHECK(!config_.model.hf_assets_path.empty() || !sft.chat_template.empty(),
                       "the dataset \"chat\" renders conversations with the model's chat "
                       "template, but model.hf_assets_path is empty and sft.chat_template unset. "
                       "HINT: set model.hf_assets_path to the model's Hugging Face folder");
    ChatTemplateFiles files;
    if (sft.chat_template.empty()) {
      files = read_chat_template_files(config_.model.hf_assets_path);
    } else {
      files.source = read_regular_file(sft.chat_template, "chat template (sft.chat_template)");
      files.origin = sft.chat_template;
      if (!config_.model.hf_assets_path.empty()) {
        files.special_tokens = read_special_tokens(config_.model.hf_assets_path);
      }
    }
    ChatTemplateOptions options;
    options.special_tokens = files.special_tokens;
    chat_encoder_ = std::make_unique<ChatEncoder>(
        std::make_shared<const ChatTemplate>(files.source, files.origin), options, *tokenizer_);
    log_info("chat fine-tuning data: conversations rendered with the chat template of ",
             files.origin,
             "; only the assistant's replies are trained, conversations packed into "
             "windows of ",
             t.seq_len,
             " positions (block-causal, positions restart per "
             "conversation), longer ones: ",
             sft.overlong);
  }
  if (chat) {
    train_chats_ = open_records(t.dataset_path, CorpusSettings::of_section("training"));
    log_info("dataset chat: ", train_chats_->size(), " conversations",
             t.dataset_shuffle ? ", shuffled each epoch" : ", in order", "; tokenizer vocab ",
             tokenizer_->vocab_size());
  } else {
    // Opened here so that a missing or corrupt corpus fails before the model is built.
    std::shared_ptr<const DocumentSource> docs = open_dataset(
        t.dataset, t.dataset_path, t.dataset_text_field, CorpusSettings::of_section("training"));
    log_info("dataset ", t.dataset, ": ", docs->size(), " documents",
             t.dataset_shuffle ? ", shuffled each epoch" : ", in order", "; tokenizer vocab ",
             tokenizer_->vocab_size());
    train_docs_ = docs;
  }
  // The global stream: every rank reads it whole and keeps its slice (see trainer.h).
  train_loader_ = make_loader("training", t.seq_len, t.local_batch_size * data_dp_size_,
                              /*infinite=*/true, t.dataset_shuffle ? seed_ : -1);
  if (config_.validation.enable) {
    const auto& v = config_.validation;
    if (validate_chat) {
      validation_chats_ = open_records(v.dataset_path, CorpusSettings::of_section("validation"));
      log_info("validation dataset chat: ", validation_chats_->size(), " conversations");
    } else {
      validation_docs_ = open_dataset(v.dataset, v.dataset_path, v.dataset_text_field,
                                      CorpusSettings::of_section("validation"));
      log_info("validation dataset ", v.dataset, ": ", validation_docs_->size(), " documents");
    }
    // Found now, not at the first validation after validation.freq training steps.
    if (!make_loader("validation", v.seq_len, v.local_batch_size * dp_size_, false, -1)->next()) {
      throw_validation_too_small(v, dp_size_);
    }
  }
}

std::unique_ptr<BatchLoader> Trainer::make_loader(const std::string& section, int64_t seq_len,
                                                  int64_t batch_size, bool infinite,
                                                  int64_t shuffle_seed) const {
  const bool training = section == "training";
  if (spec_->objective != ModelObjective::kNextToken) {
    return make_image_loader(section, batch_size, infinite);
  }
  const std::shared_ptr<const RecordSource>& chats = training ? train_chats_ : validation_chats_;
  if (chats) {
    const SftSection& sft = config_.sft;
    ChatRowFormat format{sft.messages_field, sft.prompt_field, sft.response_field,
                         sft.system_prompt};
    return std::make_unique<SftLoader>(chats, format, *chat_encoder_,
                                       overlong_from_name(sft.overlong, "sft.overlong"), seq_len,
                                       batch_size, tokenizer_->eos_id(), infinite, shuffle_seed);
  }
  return std::make_unique<DataLoader>(training ? train_docs_ : validation_docs_, *tokenizer_,
                                      seq_len, batch_size, /*dp_rank=*/0, /*dp_world=*/1, infinite,
                                      shuffle_seed);
}

std::optional<Batch> Trainer::next_local_batch(BatchLoader& loader) {
  std::optional<Batch> batch = loader.next();
  if (!batch) return batch;
  // Training batches span the replica groups too; validation runs whole in every group.
  const bool training = &loader == train_loader_.get();
  Batch local = training ? local_batch(std::move(*batch))
                         : slice_batch(std::move(*batch), dp_size_, dp_rank_);
  if (flow_) return flow_->prepare(local, /*validation=*/!training);
  return local;
}

Batch Trainer::local_batch(Batch batch) const {
  return slice_batch(std::move(batch), data_dp_size_, data_dp_rank_);
}

Batch Trainer::slice_batch(Batch batch, int64_t parts, int64_t index) const {
  std::vector<at::Tensor*> tensors = {&batch.inputs, &batch.labels, &batch.positions,
                                      &batch.document_ids};
  for (auto& [name, t] : batch.conditioning) tensors.push_back(&t);  // a row per sample
  for (at::Tensor* t : tensors) {
    if (!t->defined()) continue;
    if (parts > 1) {
      const int64_t b = t->size(0) / parts;
      *t = t->narrow(0, index * b, b).contiguous();
    }
    *t = to_device_async(*t, device_);
  }
  return batch;
}

double Trainer::validate(int64_t* tokens) {
  TITAN_CHECK(
      validation_docs_ != nullptr || validation_chats_ != nullptr || validation_images_ != nullptr,
      "validation is not enabled");
  const PhaseScope phase(Phase::kValidation);
  at::NoGradGuard no_grad;
  // Like training, every rank reads the whole stream and keeps its slice, so all ranks run the
  // same number of batches.
  const std::unique_ptr<BatchLoader> loader =
      make_loader("validation", config_.validation.seq_len,
                  config_.validation.local_batch_size * dp_size_, /*infinite=*/false, -1);
  // Where labels skip tokens (conversations, the vision-language model's image tokens) the loss
  // is the mean over the predicted tokens of the whole validation set, the same on any number of
  // ranks; elsewhere every batch predicts as many tokens, and the mean of the batch means is it.
  const bool masked =
      validation_chats_ != nullptr || spec_->objective == ModelObjective::kVisionLanguage;
  const auto options = at::TensorOptions(at::kDouble).device(device_);
  at::Tensor sum = at::zeros({}, options), predicted = at::zeros({}, options);
  int64_t n = 0, count = 0;
  while (config_.validation.steps < 0 || n < config_.validation.steps) {
    auto batch = next_local_batch(*loader);
    if (!batch) break;
    PackedBatch packing{batch->positions, batch->document_ids};
    packing.conditioning = batch->conditioning;
    const at::Tensor mean =
        parallel_->evaluate(batch->inputs, batch->labels, packing).to(at::kDouble);
    if (masked) {
      const at::Tensor k = batch->labels.ne(kernels::kIgnoreIndex).sum().to(options);
      sum += at::where(k > 0, mean * k, at::zeros_like(mean));
      predicted += k;
    } else {
      sum += mean;
    }
    ++n;
    count += flow_ ? batch->inputs.size(0) * batch->inputs.size(1) : batch->inputs.numel();
  }
  if (n == 0) throw_validation_too_small(config_.validation, dp_size_);
  if (tokens != nullptr) *tokens = count * dp_size_;
  if (masked) {
    return host_item<double>(parallel_->batch_mean(sum)) /
           std::max(host_item<double>(parallel_->batch_mean(predicted)), 1e-300);
  }
  return host_item<double>(parallel_->batch_mean(sum / static_cast<double>(n)));
}

}  // namespace titan
