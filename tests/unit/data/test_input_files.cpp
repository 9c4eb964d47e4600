// Inputs that are not regular files (a FIFO would block a reader forever, /dev/zero would fill
// memory) are refused at once by every reader with a DataError saying what they are; text must be
// UTF-8 in every format (file and byte offset named); a file without text is refused in every
// format; token files report a full disk with the errno; the tokenizer checks tied to a model or
// a checkpoint (vocabulary fit, fingerprint).
#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/components/data/document_source.h"
#include "titan/components/data/token_file.h"
#include "titan/components/tokenizer/bpe_trainer.h"
#include "titan/components/tokenizer/tokenizer.h"
#include "titan/components/tokenizer/tokenizer_identity.h"
#include "titan/components/tokenizer/unicode.h"

#include "../test_util.h"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

namespace titan {
namespace test_input_files {

namespace fs = std::filesystem;
using test::contains;
using test::write_file;

class InputFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::fresh_test_dir("titan_test_inputs");
    fifo_ = (dir_ / "pipe.jsonl").string();
    ASSERT_EQ(::mkfifo(fifo_.c_str(), 0600), 0);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  std::string fifo_;  // no writer ever opens it: reading it would block forever
};

// `fn` throws DataError whose message has every one of `parts`.
void expect_data_error(const std::function<void()>& fn, std::initializer_list<const char*> parts) {
  std::string msg;
  try {
    fn();
    ADD_FAILURE() << "no DataError";
  } catch (const DataError& e) {
    msg = e.what();
  }
  for (const char* part : parts) EXPECT_TRUE(contains(msg, part)) << msg << "\nlacks: " << part;
}

TEST_F(InputFiles, FileKindsAreNamedWithoutOpening) {
  write_file(dir_ / "a.txt", "x");
  EXPECT_EQ(non_regular_file_kind((dir_ / "a.txt").string()), "");
  EXPECT_EQ(non_regular_file_kind(fifo_), "a FIFO (named pipe)");
  EXPECT_EQ(non_regular_file_kind("/dev/zero"), "a character device");
  EXPECT_EQ(non_regular_file_kind(dir_.string()), "a directory");
  EXPECT_TRUE(contains(non_regular_file_kind((dir_ / "none").string()), "missing"));
  fs::create_symlink(dir_ / "a.txt", dir_ / "link.txt");  // links are followed
  EXPECT_EQ(non_regular_file_kind((dir_ / "link.txt").string()), "");
  EXPECT_EQ(read_regular_file((dir_ / "link.txt").string(), "input"), "x");
  expect_data_error([&] { read_regular_file(fifo_, "input"); }, {"FIFO", "pipe.jsonl"});
}

TEST_F(InputFiles, CorporaRefuseFifosAndDevicesInEveryFormat) {
  for (const CorpusFormat format :
       {CorpusFormat::kText, CorpusFormat::kJsonl, CorpusFormat::kTokens, CorpusFormat::kAuto}) {
    expect_data_error([&] { open_corpus(fifo_, format); }, {"pipe.jsonl", "FIFO (named pipe)"});
  }
  // Before: a jsonl reader read /dev/zero as one endless line.
  expect_data_error([&] { open_corpus("/dev/zero", CorpusFormat::kJsonl); },
                    {"/dev/zero", "character device", "HINT"});
  expect_data_error([&] { open_corpus("/dev/zero", CorpusFormat::kText); }, {"character device"});
  expect_data_error([&] { TokenFileReader reader(fifo_); }, {"token file", "FIFO"});
  expect_data_error([&] { TokenFileReader reader("/dev/zero"); }, {"character device"});
}

TEST_F(InputFiles, TokenizerFilesRefuseFifosAndDevices) {
  // Before: /dev/zero ended in std::bad_alloc, a FIFO blocked.
  expect_data_error([&] { build_tokenizer("/dev/zero"); }, {"tokenizer file", "character device"});
  expect_data_error([&] { build_tokenizer(fifo_); }, {"tokenizer file", "FIFO"});
  const fs::path json = dir_ / "tokenizer.json";
  ASSERT_EQ(::mkfifo(json.c_str(), 0600), 0);
  expect_data_error([&] { build_tokenizer(json.string()); }, {"tokenizer.json", "FIFO"});
}

TEST(Utf8, FindsTheFirstInvalidByte) {
  EXPECT_EQ(find_invalid_utf8(""), std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("plain \xC3\xA9 \xE4\xB8\x96 \xF0\x9F\x98\x80"),
            std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("ab\xFF"), 2u);
  EXPECT_EQ(find_invalid_utf8("ab\xC3"), 2u);            // truncated at the end
  EXPECT_EQ(find_invalid_utf8("a\xC0\xAF"), 1u);         // overlong '/'
  EXPECT_EQ(find_invalid_utf8("a\xED\xA0\x80"), 1u);     // a surrogate
  EXPECT_EQ(find_invalid_utf8("\xE4\xB8\x96\x80"), 3u);  // a stray continuation byte
}

TEST_F(InputFiles, InvalidUtf8IsRefusedInTextAsInJsonLinesWithItsOffset) {
  // Before: a .txt file with invalid UTF-8 was accepted silently.
  write_file(dir_ / "bad.txt", "good text\nbad \xFF byte\n");
  expect_data_error([&] { open_corpus((dir_ / "bad.txt").string(), CorpusFormat::kText); },
                    {"bad.txt", "invalid UTF-8 at byte offset 14", "0xFF", "HINT"});
  write_file(dir_ / "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"bad \xC3 x\"}\n");
  expect_data_error([&] { open_corpus((dir_ / "bad.jsonl").string(), CorpusFormat::kJsonl); },
                    {"bad.jsonl:2", "invalid UTF-8 at byte offset 29"});
  write_file(dir_ / "good.txt", "caf\xC3\xA9");
  EXPECT_EQ(open_corpus((dir_ / "good.txt").string(), CorpusFormat::kText)->size(), 1);
}

TEST_F(InputFiles, ASourceWithoutTextIsRefusedInEveryFormat) {
  write_file(dir_ / "empty.txt", "");
  expect_data_error([&] { open_corpus((dir_ / "empty.txt").string(), CorpusFormat::kText); },
                    {"empty.txt", "empty file"});
  // Before: trained on documents of BOS and EOS alone.
  write_file(dir_ / "empty.jsonl", "{\"text\": \"\"}\n\n{\"text\": \"\", \"id\": 2}\n");
  expect_data_error([&] { open_corpus((dir_ / "empty.jsonl").string(), CorpusFormat::kJsonl); },
                    {"empty.jsonl", "holds no text"});
  // One empty document among others stays a document (numbering is unchanged).
  write_file(dir_ / "some.jsonl", "{\"text\": \"\"}\n{\"text\": \"x\"}\n");
  EXPECT_EQ(open_corpus((dir_ / "some.jsonl").string(), CorpusFormat::kJsonl)->size(), 2);
}

// Token shards are checked whole at start-up, as text files are: a shard of no tokens (which
// used to train on BOS/EOS alone, re-looping every window) and an id past the vocabulary (found
// only when a run reached its document) are refused naming the file, byte and document.
TEST_F(InputFiles, TokenShardsAreCheckedWholeAtOpen) {
  const std::string empty = (dir_ / "empty.bin").string();
  {
    TokenFileWriter writer(empty, /*vocab_size=*/300);
    writer.add_document({});
    writer.finish();
  }
  expect_data_error([&] { open_corpus(empty, CorpusFormat::kTokens); },
                    {"empty.bin holds no tokens (1 empty documents)"});
  const std::string bad = (dir_ / "bad.bin").string();
  {
    TokenFileWriter writer(bad, /*vocab_size=*/300);
    writer.add_document({1, 2, 3});
    writer.add_document({4, 5, 6, 7});
    writer.finish();
  }
  EXPECT_EQ(open_corpus(bad, CorpusFormat::kTokens)->size(), 2);
  {
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(kTokenFileHeaderBytes + 5 * 2);  // the third id of document 1
    const char high[2] = {'\xff', '\xff'};
    f.write(high, 2);
  }
  expect_data_error([&] { open_corpus(bad, CorpusFormat::kTokens); },
                    {"bad.bin: token id 65535 at byte 50 (document 1) is >= the file's "
                     "vocab_size 300"});
}

TEST(TokenFileOutput, AFullDiskIsAWriteErrorWithTheErrno) {
  // /dev/full fails every write with ENOSPC; the buffered writes fail at finish() at the latest.
  TokenFileWriter writer("/dev/full", /*vocab_size=*/300);
  writer.add_document({1, 2, 3});
  expect_data_error([&] { writer.finish(); },
                    {"cannot write token file /dev/full", "No space left on device"});
}

TEST(TokenizerIdentity, VocabularyMustFitTheModel) {
  ByteTokenizer bytes;
  check_tokenizer_fits_model(bytes, 258, "flavor 'x'", "hint");
  std::string msg;
  try {
    check_tokenizer_fits_model(bytes, 257, "flavor 'x'", "pick another");
  } catch (const ConfigError& e) {
    msg = e.what();
  }
  EXPECT_EQ(msg,
            "tokenizer vocab 258 exceeds the model's vocab_size 257 for flavor 'x'; "
            "pick another");
}

// A small BPE trained on `text` with `vocab_size` ids, written to dir/tokenizer.json.
std::string train_bpe(const std::string& text, int64_t vocab_size, const fs::path& dir) {
  BpeTrainer trainer;
  trainer.add_text(text);
  BpeTrainerOptions options;
  options.vocab_size = vocab_size;
  write_bpe_tokenizer_json(trainer.train(options), dir.string());
  return (dir / "tokenizer.json").string();
}

TEST(TokenizerIdentity, FingerprintFollowsTheTokenizerNotThePath) {
  const auto dir = test::fresh_test_dir("titan_test_fingerprint");
  const std::string text = "the quick brown fox jumps over the lazy dog; the dog sleeps. ";
  const std::string path_a = train_bpe(text + text, 280, dir / "a");
  const std::string path_b = train_bpe(text + text, 280, dir / "b");  // the same, elsewhere
  const std::string path_c = train_bpe(text + text, 275, dir / "c");  // fewer merges
  const auto a = build_tokenizer(path_a), b = build_tokenizer(path_b), c = build_tokenizer(path_c);
  ByteTokenizer bytes;
  EXPECT_EQ(tokenizer_fingerprint(*a), tokenizer_fingerprint(*b));
  EXPECT_NE(tokenizer_fingerprint(*a), tokenizer_fingerprint(*c));
  EXPECT_NE(tokenizer_fingerprint(*a), tokenizer_fingerprint(bytes));
  EXPECT_EQ(tokenizer_fingerprint(*a).size(), 16u);

  const nlohmann::json recorded = tokenizer_record(*a, path_a);
  EXPECT_EQ(recorded.at("vocab_size").get<int64_t>(), a->vocab_size());
  EXPECT_EQ(tokenizer_difference(recorded, tokenizer_record(*b, path_b)), "");
  EXPECT_NE(tokenizer_difference(recorded, tokenizer_record(*c, path_c)), "");
  const std::string why = tokenizer_difference(recorded, tokenizer_record(bytes, ""));
  EXPECT_TRUE(contains(why, "'" + path_a + "' (vocab " + std::to_string(a->vocab_size()))) << why;
  EXPECT_TRUE(contains(why, "the byte tokenizer")) << why;
  EXPECT_TRUE(contains(why, "vocab 258")) << why;
  EXPECT_TRUE(contains(why, "HINT")) << why;
  // Checkpoints from before the record existed: nothing to compare.
  EXPECT_EQ(tokenizer_difference(nlohmann::json(), tokenizer_record(bytes, "")), "");
  fs::remove_all(dir);
}

}  // namespace test_input_files
}  // namespace titan
