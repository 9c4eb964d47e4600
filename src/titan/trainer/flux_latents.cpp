// FLUX's precomputed encodings (see flux_latents.h).
#include "titan/trainer/flux_latents.h"

#include "titan/checkpoint/safetensors.h"
#include "titan/common/check.h"
#include "titan/common/device.h"
#include "titan/common/file_io.h"
#include "titan/common/logging.h"
#include "titan/components/data/image_batches.h"
#include "titan/components/tokenizer/tokenizer.h"
#include "titan/models/flux/conditioner.h"
#include "titan/trainer/flow_matching.h"

#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace titan {
namespace fs = std::filesystem;
namespace {

constexpr const char* kFormat = "titan-flux-latents";
constexpr int64_t kShardRows = 1024;

std::string shard_name(int64_t i) {
  char name[64];
  std::snprintf(name, sizeof(name), "latents-%05lld.safetensors", static_cast<long long>(i));
  return name;
}

// What the folder must agree on with the training run (flavor, sizes, caption length).
nlohmann::json fingerprint(const JobConfig& config) {
  return {{"flavor", config.model.flavor},
          {"img_size", config.training.img_size},
          {"max_t5_encoding_len", config.encoder.max_t5_encoding_len},
          {"text", flux_text_identity(config)}};
}

}  // namespace

int64_t encode_flux_latents(const JobConfig& config, const std::string& output, int64_t rows,
                            int64_t batch_size) {
  std::error_code ec;
  if (fs::exists(output, ec)) {
    throw ConfigError(message("output folder ", output,
                              " already exists; remove it or pick "
                              "another"));
  }
  const TrainingSection& t = config.training;
  const std::unique_ptr<Tokenizer> tokenizer = build_tokenizer(config.model.hf_assets_path);
  const std::unique_ptr<FluxTokenizers> tokenizers = build_flux_tokenizers(config, *tokenizer);
  const at::Device device = select_device(t.device, 0, 1);
  const flux::FluxEncoders encoders = load_flux_encoders(
      config, config.model.flavor, flux::args_for_flavor(config.model.flavor), *tokenizers, device);
  const auto source = open_image_dataset("training", t.dataset, t.dataset_path, t, /*seed=*/0);
  ImageBatchOptions o;
  o.batch_size = 1;
  o.img_size = t.img_size;
  o.t5_tokens = config.encoder.max_t5_encoding_len;
  o.clip_tokens = 77;
  o.seed = static_cast<uint64_t>(config.debug.seed >= 0 ? config.debug.seed : 0);
  o.infinite = false;
  o.skip_unreadable = t.skip_unreadable_images;
  ImageBatchLoader loader(source, tokenizers->captions, o);
  const int64_t wanted = rows > 0 ? std::min<int64_t>(rows, source->size()) : source->size();

  const fs::path tmp = output + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw DataError("cannot create " + tmp.string() + ": " + ec.message());
  at::NoGradGuard no_grad;
  const auto ids = [](const std::vector<int64_t>& v) {
    return at::tensor(v, at::kLong).view({1, -1});
  };
  const CaptionTokenizers& captions = tokenizers->captions;
  const at::Tensor empty_t5 =
      encoders.encode_t5(ids(captions.t5_ids("", o.t5_tokens)).to(device)).to(at::kCPU);
  const at::Tensor empty_clip =
      encoders.encode_clip(ids(captions.clip_ids("", o.clip_tokens)).to(device)).to(at::kCPU);
  int64_t written = 0, shard = 0;
  std::vector<at::Tensor> moments, t5, clip;
  const auto flush = [&] {
    if (moments.empty()) return;
    std::vector<std::pair<std::string, at::Tensor>> tensors = {
        {"moments", at::cat(moments)}, {"t5", at::cat(t5)}, {"clip", at::cat(clip)}};
    if (shard == 0) {
      tensors.emplace_back("empty_t5", empty_t5);
      tensors.emplace_back("empty_clip", empty_clip);
    }
    ckpt::write_safetensors((tmp / shard_name(shard)).string(), tensors);
    ++shard;
    moments.clear();
    t5.clear();
    clip.clear();
  };
  std::vector<Batch> pending;
  const auto encode = [&] {
    if (pending.empty()) return;
    std::vector<at::Tensor> images, t5_ids, clip_ids;
    for (const Batch& b : pending) {
      images.push_back(b.inputs);
      t5_ids.push_back(b.conditioning.at("t5_tokens"));
      clip_ids.push_back(b.conditioning.at("clip_tokens"));
    }
    moments.push_back(
        encoders.autoencoder->encoder->forward(at::cat(images).to(device)).to(at::kCPU));
    t5.push_back(encoders.encode_t5(at::cat(t5_ids).to(device)).to(at::kCPU));
    clip.push_back(encoders.encode_clip(at::cat(clip_ids).to(device)).to(at::kCPU));
    written += static_cast<int64_t>(pending.size());
    pending.clear();
    if (written % kShardRows == 0) flush();
  };
  while (written + static_cast<int64_t>(pending.size()) < wanted) {
    std::optional<Batch> b = loader.next();
    if (!b) break;
    pending.push_back(std::move(*b));
    const int64_t in_shard = (written + static_cast<int64_t>(pending.size())) % kShardRows;
    if (static_cast<int64_t>(pending.size()) == batch_size || in_shard == 0) encode();
  }
  encode();
  flush();
  TITAN_CHECK(written > 0, "flux encode: no sample of the dataset could be encoded");
  nlohmann::json index = fingerprint(config);
  index["format"] = kFormat;
  index["version"] = 1;
  index["rows"] = written;
  index["shards"] = shard;
  index["shard_rows"] = kShardRows;
  index["encoders"] = encoders.describe();
  index["seed"] = o.seed;
  index["too_small"] = loader.too_small();
  index["unreadable"] = loader.unreadable();
  replace_file((tmp / "index.json").string(), index.dump(2) + "\n");
  fsync_path(tmp.string(), /*directory=*/true);
  fs::rename(tmp, output, ec);
  if (ec) throw DataError("cannot rename " + tmp.string() + " to " + output + ": " + ec.message());
  return written;
}

struct FluxLatentLoader::Impl {
  std::string folder;
  std::vector<std::unique_ptr<ckpt::SafetensorsReader>> shards;
  at::Tensor empty_t5, empty_clip;
  int64_t rows = 0, shard_rows = kShardRows;
  int64_t batch_size = 1;
  double cfg = 0;
  uint64_t seed = 0;
  bool infinite = true;
  int64_t row = 0, epoch = 0, serial = 0;
  // The shard whose rows are being read, in memory.
  int64_t loaded = -1;
  at::Tensor moments, t5, clip;
  void load(int64_t shard) {
    if (shard == loaded) return;
    moments = shards.at(shard)->read("moments");
    t5 = shards.at(shard)->read("t5");
    clip = shards.at(shard)->read("clip");
    loaded = shard;
  }
};

FluxLatentLoader::FluxLatentLoader(const std::string& folder, const JobConfig& config,
                                   int64_t batch_size, double cfg_drop_prob, uint64_t seed,
                                   bool infinite)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.folder = folder;
  const fs::path index_path = fs::path(folder) / "index.json";
  std::error_code ec;
  if (!fs::is_regular_file(index_path, ec)) {
    throw DataError(message(folder,
                            " is not a folder of FLUX encodings (no index.json). HINT: "
                            "write one with `titan flux encode`"));
  }
  nlohmann::json index;
  try {
    std::ifstream in(index_path);
    index = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(message(index_path.string(), ": not valid JSON (", e.what(), ")"));
  }
  if (index.value("format", std::string()) != kFormat) {
    throw DataError(message(index_path.string(), ": not a ", kFormat, " index"));
  }
  const nlohmann::json expected = fingerprint(config);
  for (const auto& [key, want] : expected.items()) {
    if (index.value(key, nlohmann::json()) != want) {
      throw DataError(message(folder, " was encoded with ", key, " = ",
                              index.value(key, nlohmann::json()).dump(), ", this run has ",
                              want.dump(), ". HINT: encode again with this run's config"));
    }
  }
  m.rows = index.at("rows").get<int64_t>();
  m.shard_rows = index.value("shard_rows", kShardRows);
  const int64_t shards = index.at("shards").get<int64_t>();
  for (int64_t i = 0; i < shards; ++i) {
    m.shards.push_back(
        std::make_unique<ckpt::SafetensorsReader>((fs::path(folder) / shard_name(i)).string()));
  }
  m.empty_t5 = m.shards.at(0)->read("empty_t5");
  m.empty_clip = m.shards.at(0)->read("empty_clip");
  m.batch_size = batch_size;
  m.cfg = cfg_drop_prob;
  m.seed = seed;
  m.infinite = infinite;
}

FluxLatentLoader::~FluxLatentLoader() = default;

int64_t FluxLatentLoader::rows() const { return impl_->rows; }

std::optional<Batch> FluxLatentLoader::next() {
  Impl& m = *impl_;
  std::vector<at::Tensor> moments, t5, clip;
  at::Tensor serials = at::empty({m.batch_size}, at::kLong);
  for (int64_t b = 0; b < m.batch_size; ++b) {
    if (m.row >= m.rows) {
      if (!m.infinite) return std::nullopt;
      m.row = 0;
      ++m.epoch;
    }
    m.load(m.row / m.shard_rows);
    const int64_t i = m.row % m.shard_rows;
    moments.push_back(m.moments.narrow(0, i, 1));
    const CaptionDrops drops = caption_drops(m.seed, m.serial, m.cfg);
    t5.push_back(drops.t5 ? m.empty_t5 : m.t5.narrow(0, i, 1));
    clip.push_back(drops.clip ? m.empty_clip : m.clip.narrow(0, i, 1));
    serials[b] = m.serial++;
    ++m.row;
  }
  Batch batch;
  batch.inputs = at::cat(moments);
  batch.conditioning["txt"] = at::cat(t5);
  batch.conditioning["y"] = at::cat(clip);
  batch.conditioning["sample_ids"] = serials;
  return batch;
}

nlohmann::json FluxLatentLoader::state_json() const {
  return {{"kind", "flux_latents"},
          {"row", impl_->row},
          {"epoch", impl_->epoch},
          {"serial", impl_->serial},
          {"rows", impl_->rows}};
}

void FluxLatentLoader::load_state_json(const nlohmann::json& state) {
  if (state.value("kind", std::string()) != "flux_latents" ||
      state.value("rows", int64_t{-1}) != impl_->rows) {
    throw DataError(message("flux encodings ", impl_->folder,
                            ": the checkpoint's data loader state is not this folder's (",
                            state.dump(), "); resume with the same encodings"));
  }
  impl_->row = state.at("row").get<int64_t>();
  impl_->epoch = state.at("epoch").get<int64_t>();
  impl_->serial = state.at("serial").get<int64_t>();
}

}  // namespace titan
