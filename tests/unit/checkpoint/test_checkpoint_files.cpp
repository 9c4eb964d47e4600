// safetensors and checkpoint directories: exact round trips of every dtype, sharded tensors read
// back in any box, and every kind of damage (truncation, flipped bytes, bad headers, missing
// files) detected with an error that names the file.
#include "titan/checkpoint/checkpoint_files.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/common/check.h"

#include "../test_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace titan::ckpt {
namespace test_checkpoint_files {

namespace fs = std::filesystem;
using test::message_of;

std::string fresh_dir(const std::string& tag) {
  const fs::path dir = fs::temp_directory_path() / ("titan_ckpt_files_" + tag);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

TEST(Crc32c, KnownValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  // Incremental equals one-shot, at lengths that exercise the 8-byte and tail loops.
  std::string data(1000, 'x');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31 + 7);
  EXPECT_EQ(crc32c(data.data() + 13, data.size() - 13, crc32c(data.data(), 13)),
            crc32c(data.data(), data.size()));
}

TEST(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  const std::string dir = fresh_dir("st_roundtrip");
  at::manual_seed(0);
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"f32", at::randn({3, 5})},
      {"bf16", at::randn({7}).to(at::kBFloat16)},
      {"f16", at::randn({2, 2, 2}).to(at::kHalf)},
      {"f64", at::randn({4}, at::kDouble)},
      {"i64", at::arange(10)},
      {"i32", at::arange(6, at::kInt).view({2, 3})},
      {"u8", at::arange(200, at::kByte)},
      {"bool", at::rand({9}) > 0.5},
      {"scalar", at::scalar_tensor(3.5)},
      {"empty", at::zeros({0, 4})},
      {"strided", at::randn({6, 4}).t()},  // written contiguous
  };
  const std::string path = dir + "/a.safetensors";
  const uint32_t crc = write_safetensors(path, tensors, {{"format", "pt"}, {"k", "v"}});
  SafetensorsReader reader(path);
  EXPECT_EQ(crc32c(reader.bytes().data(), reader.bytes().size()), crc);
  EXPECT_EQ(reader.metadata().at("format"), "pt");
  ASSERT_EQ(reader.entries().size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    at::Tensor back = reader.read(name);
    EXPECT_EQ(back.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(back.sizes(), t.sizes()) << name;
    EXPECT_TRUE(at::equal(back, t)) << name;
  }
  EXPECT_EQ(reader.find("nope"), nullptr);
  EXPECT_NE(message_of([&] { reader.read("nope"); }).find("no tensor 'nope'"), std::string::npos);
}

TEST(Safetensors, RejectsDamagedFiles) {
  const std::string dir = fresh_dir("st_damaged");
  const std::string path = dir + "/a.safetensors";
  write_safetensors(path, {{"w", at::ones({64, 64})}});
  const auto size = fs::file_size(path);
  fs::resize_file(path, size - 100);
  std::string err = message_of([&] { SafetensorsReader r(path); });
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;

  std::ofstream(dir + "/short.safetensors") << "abc";
  err = message_of([&] { SafetensorsReader r(dir + "/short.safetensors"); });
  EXPECT_NE(err.find("short.safetensors"), std::string::npos) << err;

  // Header length pointing past the end.
  std::ofstream(dir + "/len.safetensors", std::ios::binary)
      << std::string("\xff\xff\x00\x00\x00\x00\x00\x00{}", 10);
  err = message_of([&] { SafetensorsReader r(dir + "/len.safetensors"); });
  EXPECT_NE(err.find("header length"), std::string::npos) << err;

  // Broken JSON.
  std::string bad = std::string("\x05\x00\x00\x00\x00\x00\x00\x00", 8) + "{\"a\":";
  std::ofstream(dir + "/json.safetensors", std::ios::binary) << bad;
  err = message_of([&] { SafetensorsReader r(dir + "/json.safetensors"); });
  EXPECT_NE(err.find("not valid JSON"), std::string::npos) << err;

  // Offsets that disagree with dtype x shape.
  std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})";
  std::string len(8, '\0');
  len[0] = static_cast<char>(header.size());
  std::ofstream(dir + "/offsets.safetensors", std::ios::binary) << len << header << "abcd";
  err = message_of([&] { SafetensorsReader r(dir + "/offsets.safetensors"); });
  EXPECT_NE(err.find("do not hold 8 bytes"), std::string::npos) << err;
}

TEST(CheckpointFiles, RoundTripWithStateAndShardSplitting) {
  const std::string root = fresh_dir("ck_roundtrip");
  at::manual_seed(1);
  std::vector<SavedTensor> tensors;
  for (int i = 0; i < 6; ++i) {
    tensors.push_back({"layers." + std::to_string(i) + ".w", at::randn({32, 16}), {}});
  }
  tensors.push_back({"step_scalar", at::scalar_tensor(5, at::kLong), {}});
  nlohmann::json state = {{"step", 12}, {"nested", {{"a", {1, 2, 3}}}}};
  const std::string dir = root + "/step-12";
  write_checkpoint(dir, tensors, state, /*max_shard_bytes=*/5000);
  EXPECT_FALSE(fs::exists(dir + ".tmp-" + std::to_string(::getpid())));
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.path().extension() == ".safetensors";
  EXPECT_EQ(files, 3);  // 2 KiB per tensor, 2 per 5000-byte shard; the scalar joins the last

  CheckpointReader reader(dir);
  EXPECT_EQ(reader.state(), state);
  EXPECT_EQ(reader.names().size(), tensors.size());
  for (const auto& t : tensors) EXPECT_TRUE(at::equal(reader.read(t.name), t.local)) << t.name;
  EXPECT_TRUE(at::equal(reader.read_slice("layers.3.w", {4, 2}, {10, 5}),
                        tensors[3].local.slice(0, 4, 14).slice(1, 2, 7)));
  EXPECT_THROW(write_checkpoint(dir, tensors, state), DataError);  // never overwrites

  auto steps = list_step_dirs(root);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].first, 12);
  fs::create_directories(root + "/step-13.tmp-99");  // an unfinished save is not a checkpoint
  fs::create_directories(root + "/step-14");         // nor is a directory without index.json
  EXPECT_EQ(list_step_dirs(root).size(), 1u);
}

// A tensor saved as boxes (as sharded ranks will) reads back whole or in boxes that cross them.
TEST(CheckpointFiles, ShardedTensorReadsAcrossBoxes) {
  const std::string root = fresh_dir("ck_sharded");
  at::Tensor full = at::arange(8 * 6, at::kFloat).view({8, 6});
  std::vector<SavedTensor> tensors = {
      {"w", full.slice(0, 0, 3), {{8, 6}, {0, 0}}},
      {"w", full.slice(0, 3, 8).slice(1, 0, 4), {{8, 6}, {3, 0}}},
      {"w", full.slice(0, 3, 8).slice(1, 4, 6), {{8, 6}, {3, 4}}},
  };
  write_checkpoint(root + "/step-1", tensors, nlohmann::json::object(), /*max_shard_bytes=*/64);
  CheckpointReader reader(root + "/step-1");
  EXPECT_EQ(reader.meta("w").shape, (std::vector<int64_t>{8, 6}));
  EXPECT_TRUE(at::equal(reader.read("w"), full));
  EXPECT_TRUE(
      at::equal(reader.read_slice("w", {2, 3}, {4, 3}), full.slice(0, 2, 6).slice(1, 3, 6)));

  // A box nobody saved is an error, not zeros: the writer refuses to leave a hole...
  std::string err = message_of([&] {
    write_checkpoint(root + "/step-2", {tensors[0], tensors[1]}, nlohmann::json::object());
  });
  EXPECT_NE(err.find("cover 38 of its 48 elements"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(root + "/step-2"));
  EXPECT_FALSE(fs::exists(root + "/step-2.tmp-" + std::to_string(::getpid())));
  // ...and the reader refuses, when it opens it, an index that lists too few boxes (an
  // unprotected version-1 one).
  fs::copy(root + "/step-1", root + "/step-3");
  nlohmann::json index = nlohmann::json::parse(std::ifstream(root + "/step-3/index.json"));
  index["version"] = 1;
  index.erase("checksum");
  auto& shards = index["tensors"]["w"]["shards"];
  ASSERT_EQ(shards.size(), 3u);
  shards.erase(2);  // the box at [3, 4]
  std::ofstream(root + "/step-3/index.json", std::ios::trunc) << index.dump();
  err = message_of([&] { CheckpointReader partial(root + "/step-3"); });
  EXPECT_NE(err.find("tensor 'w' [8, 6]: the pieces cover 38 of its 48 elements, leaving a gap"),
            std::string::npos)
      << err;
}

TEST(CheckpointFiles, DetectsCorruptionNamingTheFile) {
  const std::string root = fresh_dir("ck_corrupt");
  std::vector<SavedTensor> tensors = {{"w", at::randn({128, 128}), {}}};
  const std::string dir = root + "/step-1";
  write_checkpoint(dir, tensors, {{"step", 1}});
  const std::string shard = dir + "/shard-00000.safetensors";

  flip_byte(shard, fs::file_size(shard) - 1000);  // inside tensor data
  std::string err = message_of([&] { CheckpointReader r(dir); });
  EXPECT_NE(err.find(shard), std::string::npos) << err;
  EXPECT_NE(err.find("corrupted"), std::string::npos) << err;
  EXPECT_NO_THROW(CheckpointReader(dir, /*verify=*/false));

  fs::resize_file(shard, fs::file_size(shard) - 10);
  err = message_of([&] { CheckpointReader r(dir); });
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;

  fs::remove(shard);
  err = message_of([&] { CheckpointReader r(dir); });
  EXPECT_NE(err.find("missing"), std::string::npos) << err;

  std::ofstream(dir + "/index.json", std::ios::trunc) << "{\"format\": \"titan-checkpoint\", ";
  err = message_of([&] { CheckpointReader r(dir); });
  EXPECT_NE(err.find("index.json: not valid JSON"), std::string::npos) << err;

  fs::remove(dir + "/index.json");
  err = message_of([&] { CheckpointReader r(dir); });
  EXPECT_NE(err.find("is not a checkpoint"), std::string::npos) << err;
}

}  // namespace test_checkpoint_files
}  // namespace titan::ckpt
