// `titan data prepare` as a library call: text and JSON lines -> token shards that read back as
// the same token stream, its refusals, and the bounded memory of streaming a large corpus.
#include "titan/common/check.h"
#include "titan/components/data/data_loader.h"
#include "titan/components/data/document_source.h"
#include "titan/components/data/prepare.h"
#include "titan/components/data/token_file.h"

#include "../test_util.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace titan {
namespace test_prepare {

namespace fs = std::filesystem;
using test::contains;
using test::message_of;
using test::write_file;

// Resident set size of this process, in bytes (Linux).
int64_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      return std::stoll(line.substr(6)) * 1024;
    }
  }
  return -1;
}

class PrepareDir : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::fresh_test_dir("titan_test_prepare"); }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(PrepareDir, ShardsReadBackAsTheSameTokenStream) {
  write_file(dir_ / "in" / "a.txt", "The first document.\nTwo lines.");
  std::string jsonl;
  for (int i = 0; i < 40; ++i) {
    jsonl += "{\"body\": \"line " + std::to_string(i) + std::string(i % 7, '!') + "\"}\n";
  }
  write_file(dir_ / "in" / "b" / "c.jsonl", jsonl);
  write_file(dir_ / "extra.txt", "Given as a second input.");

  ByteTokenizer tok;
  PrepareOptions options;
  options.inputs = {(dir_ / "in").string(), (dir_ / "extra.txt").string()};
  options.output_dir = (dir_ / "out").string();
  options.text_field = "body";
  options.shard_tokens = 100;
  const PrepareStats stats = prepare_token_shards(options, tok);
  EXPECT_EQ(stats.documents, 42);
  EXPECT_GT(stats.shards, 2);
  EXPECT_EQ(static_cast<int64_t>(stats.shard_paths.size()), stats.shards);
  EXPECT_EQ(fs::path(stats.shard_paths[0]).filename(), "shard_00000.bin");

  auto text =
      open_text_corpus({(dir_ / "in" / "a.txt").string(), (dir_ / "in" / "b" / "c.jsonl").string(),
                        (dir_ / "extra.txt").string()},
                       "body");
  auto tokens = open_corpus(options.output_dir, CorpusFormat::kTokens);
  ASSERT_EQ(tokens->size(), text->size());
  EXPECT_EQ(tokens->token_vocab_size(), tok.vocab_size());
  int64_t total = 0;
  for (int64_t i = 0; i < text->size(); ++i) {
    const std::vector<int64_t> ids = tokens->encode(i, tok);
    EXPECT_EQ(ids, tok.encode(text->text(i))) << text->describe(i);
    total += static_cast<int64_t>(ids.size());
  }
  EXPECT_EQ(total, stats.tokens);
  for (const std::string& shard : stats.shard_paths) {
    TokenFileReader reader(shard);
    // A shard only exceeds the limit when one document alone does.
    EXPECT_TRUE(reader.num_tokens() <= 100 || reader.num_documents() == 1) << shard;
  }

  // Training on the shards gives the batches training on the text gives.
  DataLoader from_text(text, tok, /*seq_len=*/16, /*batch_size=*/3, 0, 1, true, 42);
  DataLoader from_tokens(tokens, tok, /*seq_len=*/16, /*batch_size=*/3, 0, 1, true, 42);
  for (int i = 0; i < 20; ++i) {
    const Batch a = *from_text.next();
    const Batch b = *from_tokens.next();
    ASSERT_TRUE(at::equal(a.inputs, b.inputs)) << "batch " << i;
  }
}

TEST_F(PrepareDir, RefusesBadInputsAndOldShards) {
  ByteTokenizer tok;
  PrepareOptions options;
  options.output_dir = (dir_ / "out").string();
  EXPECT_THROW(prepare_token_shards(options, tok), ConfigError);  // no input

  options.inputs = {(dir_ / "missing.jsonl").string()};
  std::string msg = message_of([&] { prepare_token_shards(options, tok); });
  EXPECT_TRUE(contains(msg, "missing.jsonl")) << msg;
  // Hints name prepare's own flags, not the trainer's config keys.
  EXPECT_TRUE(contains(msg, "HINT: set --input to")) << msg;
  EXPECT_FALSE(contains(msg, "training.")) << msg;
  write_file(dir_ / "notes.md", "no known extension");
  options.inputs = {(dir_ / "notes.md").string()};
  msg = message_of([&] { prepare_token_shards(options, tok); });
  EXPECT_TRUE(contains(msg, "rename it to one of those extensions")) << msg;
  write_file(dir_ / "other.jsonl", "{\"body\": \"x\"}\n");
  options.inputs = {(dir_ / "other.jsonl").string()};
  msg = message_of([&] { prepare_token_shards(options, tok); });
  EXPECT_TRUE(contains(msg, "HINT: set --text-field to")) << msg;
  fs::remove(dir_ / "notes.md");
  fs::remove(dir_ / "other.jsonl");

  write_file(dir_ / "bad.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"broken\"\n");
  options.inputs = {(dir_ / "bad.jsonl").string()};
  msg = message_of([&] { prepare_token_shards(options, tok); });
  EXPECT_TRUE(contains(msg, "bad.jsonl:2: malformed JSON")) << msg;
  EXPECT_FALSE(fs::exists(dir_ / "out" / "shard_00000.bin"));  // checked before writing

  write_file(dir_ / "ok.txt", "fine");
  options.inputs = {(dir_ / "ok.txt").string()};
  options.shard_tokens = 0;
  EXPECT_THROW(prepare_token_shards(options, tok), ConfigError);
  options.shard_tokens = 1000;
  EXPECT_EQ(prepare_token_shards(options, tok).documents, 1);
  msg = message_of([&] { prepare_token_shards(options, tok); });
  EXPECT_TRUE(contains(msg, "already holds shard_00000.bin")) << msg;

  options.inputs = {(dir_ / "out" / "shard_00000.bin").string()};
  options.output_dir = (dir_ / "out2").string();
  msg = message_of([&] { prepare_token_shards(options, tok); });
  EXPECT_TRUE(contains(msg, "already a token file")) << msg;
}

TEST_F(PrepareDir, StreamingALargeCorpusKeepsMemoryBounded) {
  // ~48 MB of JSON lines: whole in memory it would be 48 MB of text and 384 MB of int64 tokens.
  constexpr int kDocs = 6000;
  constexpr size_t kDocBytes = 8000;
  {
    std::ofstream out(dir_ / "big.jsonl");
    std::string body(kDocBytes, 'a');
    for (int i = 0; i < kDocs; ++i) {
      body[i % kDocBytes] = static_cast<char>('b' + i % 20);
      out << "{\"text\": \"" << body << "\"}\n";
    }
  }
  ASSERT_GT(fs::file_size(dir_ / "big.jsonl"), 45u << 20);
  const int64_t baseline = resident_bytes();
  ASSERT_GT(baseline, 0);
  ByteTokenizer tok;
  auto source = open_corpus((dir_ / "big.jsonl").string(), CorpusFormat::kJsonl);
  DataLoader loader(source, tok, /*seq_len=*/1023, /*batch_size=*/4, 0, 1, /*infinite=*/false,
                    /*shuffle_seed=*/5);
  int64_t peak = resident_bytes();
  int64_t batches = 0;
  while (loader.next()) {
    if (++batches % 256 == 0) {
      peak = std::max(peak, resident_bytes());
    }
  }
  const int64_t expected_tokens = kDocs * static_cast<int64_t>(kDocBytes + 2);
  EXPECT_EQ(batches, expected_tokens / (4 * 1024));
  EXPECT_LT(peak - baseline, int64_t{16} << 20)
      << "resident memory grew by " << (peak - baseline) / (1 << 20) << " MiB";
}

}  // namespace test_prepare
}  // namespace titan
