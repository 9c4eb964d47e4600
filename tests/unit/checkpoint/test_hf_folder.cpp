// Hugging Face folders on disk: single and sharded writing and reading, checkpoint -> HF ->
// checkpoint bit for bit, load_model from every kind of path (same logits as the original
// model), the trainer hooks (load_hf_weights / save_hf_weights), bf16 export, tokenizer files,
// and errors that name the file.
#include "hf_test_util.h"

#include "titan/checkpoint/checkpoint_files.h"
#include "titan/checkpoint/hf_convert.h"
#include "titan/checkpoint/hf_folder.h"
#include "titan/checkpoint/model_loader.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/common/check.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

namespace titan {
namespace test_hf_folder {

namespace fs = std::filesystem;
using test::bit_equal;
using test::contains;
using test::message_of;

const nlohmann::json kTiny = {{"name", "llama3"}, {"flavor", "tiny"}};

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream buf;
  buf << in.rdbuf();
  return nlohmann::json::parse(buf.str());
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// A model-only checkpoint of `model` in `dir`, as the trainer writes one.
void save_checkpoint(const Model& model, const nlohmann::json& description, const std::string& dir,
                     const std::string& tokenizer_path = "") {
  std::vector<ckpt::SavedTensor> tensors;
  for (const auto& item : model.named_parameters()) {
    tensors.push_back({item.key(), item.value().detach(), {}});
  }
  // Optimizer state rides along in real checkpoints; conversion must ignore it.
  tensors.push_back({"optimizer.norm.weight.exp_avg", at::zeros({7}), {}});
  ckpt::write_checkpoint(dir, tensors,
                         {{"model", description}, {"tokenizer_path", tokenizer_path}});
}

at::Tensor logits_of(Model& model) {
  at::NoGradGuard no_grad;
  const at::Tensor tokens =
      at::tensor(std::vector<int64_t>{1, 5, 9, 2, 100, 3}, at::kLong).view({1, 6});
  return model.forward(tokens);
}

void expect_checkpoint_round_trip(const nlohmann::json& description, uint64_t max_shard_bytes) {
  const fs::path dir = test::fresh_test_dir("hf_round_trip");
  const auto model = test::seeded_model(description, 3);
  save_checkpoint(*model, description, (dir / "step-5").string());
  ckpt::HfWriteOptions options;
  options.max_shard_bytes = max_shard_bytes;
  ckpt::checkpoint_to_hf((dir / "step-5").string(), (dir / "hf").string(), options);
  ckpt::hf_to_checkpoint((dir / "hf").string(), (dir / "back").string());

  const ckpt::CheckpointReader back((dir / "back").string());
  EXPECT_EQ(get_model_spec("llama3").resolve_args(back.state()["model"]),
            get_model_spec("llama3").resolve_args(description));
  const TensorMap tensors = ckpt::read_model_tensors(back);
  EXPECT_EQ(back.names().size(), tensors.size());  // model-only: no optimizer state
  for (const auto& item : model->named_parameters()) {
    ASSERT_TRUE(tensors.count(item.key())) << item.key();
    EXPECT_TRUE(bit_equal(tensors.at(item.key()), item.value())) << item.key();
  }
  EXPECT_EQ(back.state()["tokenizer_path"], "");  // the HF folder has no tokenizer files
  // Marked as the checkpoint manager marks a model-only save (checkpoint.initial_load_path).
  EXPECT_EQ(back.state()["model_only"], true);
  EXPECT_TRUE(back.state()["entries"].contains("model"));
}

TEST(HfFolder, CheckpointRoundTripIsBitIdentical) {
  expect_checkpoint_round_trip(kTiny, 5'000'000'000ull);
  expect_checkpoint_round_trip(test::custom_tied_gqa_description(), 5'000'000'000ull);
  expect_checkpoint_round_trip(test::custom_tied_gqa_description(), 20'000);  // sharded
}

TEST(HfFolder, SingleFileLayoutAndConfig) {
  const fs::path dir = test::fresh_test_dir("hf_single");
  const auto model = test::seeded_model(kTiny, 1);
  ckpt::HfWriteOptions options;
  options.bos_id = 256;
  options.eos_id = 257;
  ckpt::save_hf_weights(*model, kTiny, (dir / "hf").string(), options);
  EXPECT_TRUE(fs::is_regular_file(dir / "hf" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "hf" / "model.safetensors.index.json"));
  const nlohmann::json config = read_json(dir / "hf" / "config.json");
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_EQ(config["bos_token_id"], 256);
  EXPECT_EQ(config["eos_token_id"], 257);
  EXPECT_EQ(config["hidden_size"], 64);
  const ckpt::SafetensorsReader file((dir / "hf" / "model.safetensors").string());
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.entries().size(), model->named_parameters().size());
  // Natural order: layer 0's tensors, then layer 1's, lm_head first (alphabetical prefix).
  EXPECT_EQ(file.entries().front().name, "lm_head.weight");
  EXPECT_EQ(file.entries().back().name, "model.norm.weight");
  // No temporary folder is left behind, and the output may not be overwritten.
  for (const auto& entry : fs::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().filename(), "hf");
  }
  EXPECT_TRUE(contains(
      message_of([&] { ckpt::save_hf_weights(*model, kTiny, (dir / "hf").string(), options); }),
      "already exists"));
}

TEST(HfFolder, ShardsAboveTheSizeLimit) {
  const fs::path dir = test::fresh_test_dir("hf_sharded");
  const auto model = test::seeded_model(kTiny, 2);
  ckpt::HfWriteOptions options;
  options.max_shard_bytes = 50'000;  // tiny: ~150 KB of float32 weights, 77 KB embedding/head
  ckpt::save_hf_weights(*model, kTiny, (dir / "hf").string(), options);
  EXPECT_FALSE(fs::exists(dir / "hf" / "model.safetensors"));
  const nlohmann::json index = read_json(dir / "hf" / "model.safetensors.index.json");
  const nlohmann::json& weight_map = index["weight_map"];
  EXPECT_EQ(weight_map.size(), model->named_parameters().size());
  std::set<std::string> files;
  for (const auto& item : weight_map.items()) files.insert(item.value().get<std::string>());
  ASSERT_GE(files.size(), 3u);
  char first[64];
  std::snprintf(first, sizeof(first), "model-00001-of-%05zu.safetensors", files.size());
  EXPECT_EQ(*files.begin(), first);
  int64_t total = 0;
  for (const auto& file : files) {
    const ckpt::SafetensorsReader reader((dir / "hf" / file).string());
    int64_t bytes = 0;
    for (const auto& e : reader.entries()) bytes += static_cast<int64_t>(e.end - e.begin);
    // Over the limit only when a single tensor is.
    EXPECT_TRUE(bytes <= 50'000 || reader.entries().size() == 1) << file;
    total += bytes;
  }
  EXPECT_EQ(index["metadata"]["total_size"], total);
  // Read back: every tensor, same values as the unsharded export.
  ckpt::HfWriteOptions single;
  ckpt::save_hf_weights(*model, kTiny, (dir / "hf1").string(), single);
  const ckpt::HfFolderReader sharded((dir / "hf").string());
  const ckpt::HfFolderReader whole((dir / "hf1").string());
  EXPECT_EQ(sharded.files().size(), files.size());
  ASSERT_EQ(sharded.names(), whole.names());
  for (const std::string& name : whole.names()) {
    EXPECT_TRUE(bit_equal(sharded.read(name), whole.read(name))) << name;
  }
}

TEST(HfFolder, LoadModelFromEveryKindOfPathGivesTheSameLogits) {
  const fs::path dir = test::fresh_test_dir("hf_load_model");
  const auto model = test::seeded_model(kTiny, 4);
  const at::Tensor expected = logits_of(*model);
  save_checkpoint(*model, kTiny, (dir / "ckpt" / "step-10").string());
  // An older, different checkpoint and a half-written newer one must not be picked.
  save_checkpoint(*test::seeded_model(kTiny, 5), kTiny, (dir / "ckpt" / "step-9").string());
  fs::create_directories(dir / "ckpt" / "step-11.tmp-123");
  ckpt::checkpoint_to_hf((dir / "ckpt" / "step-10").string(), (dir / "hf").string(), {});

  for (const std::string& path :
       {(dir / "ckpt" / "step-10").string(), (dir / "ckpt").string(), (dir / "hf").string()}) {
    const ckpt::LoadedModel loaded = ckpt::load_model(path, at::kFloat, 16);
    EXPECT_EQ(loaded.model_name, "llama3");
    EXPECT_EQ(loaded.flavor, "tiny");
    EXPECT_TRUE(bit_equal(logits_of(*loaded.model), expected)) << path;
  }
  EXPECT_EQ(ckpt::load_model((dir / "ckpt").string(), at::kFloat, 16).source,
            (dir / "ckpt" / "step-10").string());
  // A corrupt newest checkpoint falls back to the previous one.
  {
    std::fstream f(dir / "ckpt" / "step-10" / "index.json", std::ios::in | std::ios::out);
    f.seekp(0);
    f << "garbage";
  }
  EXPECT_EQ(ckpt::load_model((dir / "ckpt").string(), at::kFloat, 16).source,
            (dir / "ckpt" / "step-9").string());
  EXPECT_TRUE(
      contains(message_of([&] { ckpt::load_model((dir / "nothing").string(), at::kFloat, 16); }),
               "does not exist"));
  fs::create_directories(dir / "empty");
  EXPECT_TRUE(
      contains(message_of([&] { ckpt::load_model((dir / "empty").string(), at::kFloat, 16); }),
               "neither a titan checkpoint"));
}

TEST(HfFolder, TrainerHooksLoadAndSave) {
  const fs::path dir = test::fresh_test_dir("hf_hooks");
  const nlohmann::json tied = test::custom_tied_gqa_description();
  const auto source = test::seeded_model(tied, 6);
  ckpt::save_hf_weights(*source, tied, (dir / "hf").string(), {});
  const auto target = test::seeded_model(tied, 7);
  ckpt::load_hf_weights(*target, tied, (dir / "hf").string());
  for (const auto& item : source->named_parameters()) {
    EXPECT_TRUE(bit_equal(target->named_parameters()[item.key()], item.value())) << item.key();
  }
  // load_model labels dims of no flavor by their sizes.
  EXPECT_EQ(ckpt::load_model((dir / "hf").string(), at::kFloat, 16).flavor,
            "custom (dim 96, ffn_dim 200, head_dim 16, n_heads 6, n_kv_heads 2, n_layers 2, "
            "vocab_size 130)");
  // Another architecture: named, with both values.
  nlohmann::json other = tied;
  other["args"]["n_heads"] = 3;
  other["args"]["n_kv_heads"] = 1;
  const auto wrong = test::seeded_model(other, 0);
  const std::string msg =
      message_of([&] { ckpt::load_hf_weights(*wrong, other, (dir / "hf").string()); });
  EXPECT_TRUE(contains(msg, "n_heads: model 3, config.json 6")) << msg;
  EXPECT_TRUE(
      contains(message_of([&] { ckpt::load_hf_weights(*wrong, kTiny, (dir / "hf").string()); }),
               "another architecture"));
}

TEST(HfFolder, Bfloat16Export) {
  const fs::path dir = test::fresh_test_dir("hf_bf16");
  const auto model = test::seeded_model(kTiny, 8);
  ckpt::HfWriteOptions options;
  options.dtype = at::kBFloat16;
  ckpt::save_hf_weights(*model, kTiny, (dir / "hf").string(), options);
  EXPECT_EQ(read_json(dir / "hf" / "config.json")["torch_dtype"], "bfloat16");
  const ckpt::HfFolderReader reader((dir / "hf").string());
  const at::Tensor embed = reader.read("model.embed_tokens.weight");
  EXPECT_EQ(embed.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(
      bit_equal(embed, model->named_parameters()["tok_embeddings.weight"].to(at::kBFloat16)));
  // Loading upcasts to the float32 parameters exactly.
  const auto target = test::seeded_model(kTiny, 9);
  ckpt::load_hf_weights(*target, kTiny, (dir / "hf").string());
  EXPECT_TRUE(bit_equal(target->named_parameters()["tok_embeddings.weight"], embed.to(at::kFloat)));
}

TEST(HfFolder, TokenizerFilesAreCopied) {
  const fs::path dir = test::fresh_test_dir("hf_tokenizer");
  write_text(dir / "tok.json", "{\"model\": {}}");
  const auto model = test::seeded_model(kTiny, 1);
  ckpt::HfWriteOptions options;
  options.tokenizer_path = (dir / "tok.json").string();
  ckpt::save_hf_weights(*model, kTiny, (dir / "hf").string(), options);
  EXPECT_TRUE(fs::is_regular_file(dir / "hf" / "tokenizer.json"));
  EXPECT_TRUE(fs::is_regular_file(dir / "hf" / "tokenizer_config.json"));
  EXPECT_EQ(ckpt::hf_tokenizer_path((dir / "hf").string()), (dir / "hf").string());
  // from-hf records the folder as the tokenizer path.
  ckpt::hf_to_checkpoint((dir / "hf").string(), (dir / "back").string());
  EXPECT_EQ(ckpt::CheckpointReader((dir / "back").string()).state()["tokenizer_path"],
            fs::absolute(dir / "hf").lexically_normal().string());
  // A folder: the known files, original/tokenizer.model included.
  fs::create_directories(dir / "tokdir" / "original");
  write_text(dir / "tokdir" / "vocab.json", "{}");
  write_text(dir / "tokdir" / "merges.txt", "");
  write_text(dir / "tokdir" / "original" / "tokenizer.model", "");
  write_text(dir / "tokdir" / "notes.txt", "");
  options.tokenizer_path = (dir / "tokdir").string();
  ckpt::save_hf_weights(*model, kTiny, (dir / "hf2").string(), options);
  EXPECT_TRUE(fs::is_regular_file(dir / "hf2" / "vocab.json"));
  EXPECT_TRUE(fs::is_regular_file(dir / "hf2" / "merges.txt"));
  EXPECT_TRUE(fs::is_regular_file(dir / "hf2" / "original" / "tokenizer.model"));
  EXPECT_FALSE(fs::exists(dir / "hf2" / "notes.txt"));
  options.tokenizer_path = (dir / "missing").string();
  EXPECT_TRUE(contains(
      message_of([&] { ckpt::save_hf_weights(*model, kTiny, (dir / "hf3").string(), options); }),
      "missing' does not exist"));
  EXPECT_FALSE(fs::exists(dir / "hf3"));
}

TEST(HfFolder, CorruptFoldersNameTheFile) {
  const fs::path dir = test::fresh_test_dir("hf_corrupt");
  const auto model = test::seeded_model(kTiny, 1);
  ckpt::HfWriteOptions sharded;
  sharded.max_shard_bytes = 50'000;
  ckpt::save_hf_weights(*model, kTiny, (dir / "hf").string(), sharded);
  const std::string hf = (dir / "hf").string();

  const auto load_error = [&] {
    return message_of([&] { ckpt::hf_to_checkpoint(hf, (dir / "out").string()); });
  };
  // Index points at a tensor its shard lacks.
  nlohmann::json index = read_json(dir / "hf" / "model.safetensors.index.json");
  const nlohmann::json original_index = index;
  const std::string first_shard = index["weight_map"]["lm_head.weight"];
  const std::string norm_shard = index["weight_map"]["model.norm.weight"];
  ASSERT_NE(first_shard, norm_shard);
  index["weight_map"]["model.extra.weight"] = first_shard;
  write_text(dir / "hf" / "model.safetensors.index.json", index.dump());
  EXPECT_TRUE(contains(load_error(), "lacks tensor 'model.extra.weight'")) << load_error();
  // A shard missing.
  write_text(dir / "hf" / "model.safetensors.index.json", original_index.dump());
  fs::rename(dir / "hf" / norm_shard, dir / "moved.safetensors");
  EXPECT_TRUE(contains(load_error(), norm_shard)) << load_error();
  fs::rename(dir / "moved.safetensors", dir / "hf" / norm_shard);
  // A tensor missing from the weights altogether.
  index = original_index;
  index["weight_map"].erase("model.norm.weight");
  write_text(dir / "hf" / "model.safetensors.index.json", index.dump());
  EXPECT_TRUE(contains(load_error(), "no Hugging Face tensor for parameter 'norm.weight'"))
      << load_error();
  write_text(dir / "hf" / "model.safetensors.index.json", original_index.dump());
  // config.json: broken JSON, unsupported model type or settings.
  const nlohmann::json config = read_json(dir / "hf" / "config.json");
  write_text(dir / "hf" / "config.json", "{\"hidden_size\": ");
  EXPECT_TRUE(contains(load_error(), "config.json: not valid JSON")) << load_error();
  nlohmann::json other = config;
  other["model_type"] = "gpt2";
  write_text(dir / "hf" / "config.json", other.dump());
  EXPECT_TRUE(
      contains(load_error(), "config.json: Hugging Face model_type 'gpt2' is not supported"))
      << load_error();
  other = config;
  other["num_hidden_layers"] = 3;  // layer 2's tensors are missing
  write_text(dir / "hf" / "config.json", other.dump());
  EXPECT_TRUE(contains(load_error(), "no Hugging Face tensor for parameter 'layers.2."))
      << load_error();
  other = config;
  other["hidden_size"] = 128;
  other["head_dim"] = 32;
  write_text(dir / "hf" / "config.json", other.dump());
  EXPECT_TRUE(contains(load_error(), "has shape [300, 64], config.json implies [300, 128]"))
      << load_error();
  write_text(dir / "hf" / "config.json", config.dump());
  // No weights at all.
  fs::remove(dir / "hf" / "model.safetensors.index.json");
  EXPECT_TRUE(contains(load_error(), "has neither model.safetensors nor")) << load_error();
  EXPECT_FALSE(fs::exists(dir / "out"));
}

}  // namespace test_hf_folder
}  // namespace titan
