// User corpora on disk: text files, JSON lines and token files read through DocumentSource, the
// registry names that open them, and every kind of bad input reported with file and line/offset.
#include "titan/common/check.h"
#include "titan/components/data/data_loader.h"
#include "titan/components/data/dataset.h"
#include "titan/components/data/document_source.h"
#include "titan/components/data/token_file.h"

#include "../test_util.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace titan {
namespace test_document_source {

namespace fs = std::filesystem;
using test::contains;
using test::message_of;
using test::write_file;

std::vector<std::string> texts_of(const DocumentSource& source) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < source.size(); ++i) {
    out.push_back(source.text(i));
  }
  return out;
}

class CorpusDir : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::fresh_test_dir("titan_test_corpus"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(CorpusDir, TextFilesAreDocumentsInSortedPathOrder) {
  write_file(dir_ / "b.txt", "second");
  write_file(dir_ / "a" / "z.txt", "first");
  write_file(dir_ / "c" / "d" / "e.TXT", "third");
  write_file(dir_ / "notes.md", "skipped: not a .txt file");
  write_file(dir_ / ".hidden.txt", "skipped: hidden");
  auto source = open_corpus(dir_.string(), CorpusFormat::kText);
  EXPECT_EQ(texts_of(*source), (std::vector<std::string>{"first", "second", "third"}));
  EXPECT_EQ(source->describe(1), path("b.txt"));
  EXPECT_EQ(source->token_vocab_size(), 0);
  ByteTokenizer tok;
  EXPECT_EQ(source->encode(0, tok), tok.encode("first"));
  // A file named directly is read whatever its extension.
  EXPECT_EQ(texts_of(*open_corpus(path("notes.md"), CorpusFormat::kText)).size(), 1u);
}

TEST_F(CorpusDir, JsonLinesAreOneDocumentPerLine) {
  write_file(dir_ / "part1.jsonl",
             "{\"text\": \"alpha\", \"id\": 1}\n\n{\"text\": \"b\\u00e9ta\\n\"}\r\n");
  write_file(dir_ / "part2.json", "{\"text\": \"\", \"meta\": {}}\n{\"text\": \"gamma\"}");
  auto source = open_corpus(dir_.string(), CorpusFormat::kJsonl);
  EXPECT_EQ(texts_of(*source), (std::vector<std::string>{"alpha", "b\xc3\xa9ta\n", "", "gamma"}));
  EXPECT_EQ(source->describe(0), path("part1.jsonl") + ":1");
  EXPECT_EQ(source->describe(1), path("part1.jsonl") + ":3");  // blank line 2 is skipped
  EXPECT_EQ(source->describe(3), path("part2.json") + ":2");
}

TEST_F(CorpusDir, JsonTextFieldIsConfigurable) {
  write_file(dir_ / "c.jsonl", "{\"content\": \"one\"}\n{\"content\": \"two\", \"text\": 3}\n");
  auto source = open_dataset("jsonl", path("c.jsonl"), /*text_field=*/"content");
  EXPECT_EQ(texts_of(*source), (std::vector<std::string>{"one", "two"}));
}

TEST_F(CorpusDir, AutoDetectsFormatByExtension) {
  write_file(dir_ / "a.txt", "plain");
  write_file(dir_ / "b.jsonl", "{\"text\": \"line\"}\n");
  auto source = open_dataset("auto", dir_.string());
  EXPECT_EQ(texts_of(*source), (std::vector<std::string>{"plain", "line"}));

  TokenFileWriter writer(path("c.bin"), ByteTokenizer::kVocabSize);
  writer.add_document({1, 2});
  writer.finish();
  const std::string msg = message_of([&] { open_dataset("auto", dir_.string()); });
  EXPECT_TRUE(contains(msg, "mixes token files")) << msg;
  EXPECT_EQ(open_dataset("auto", path("c.bin"))->size(), 1);
  const std::string unknown = message_of([&] { open_dataset("auto", path("a.txt") + ".md"); });
  EXPECT_TRUE(contains(unknown, "does not exist")) << unknown;
}

TEST_F(CorpusDir, RegistryNamesUserCorpora) {
  const std::vector<std::string> names = dataset_names();
  for (const char* name : {"text", "jsonl", "tokens", "auto", "sotu"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
  // User corpora have no default location: the path is required.
  const std::string msg = message_of([] { open_dataset("jsonl", ""); });
  EXPECT_TRUE(contains(msg, "dataset_path")) << msg;
  EXPECT_THROW(open_dataset("jsonl", ""), ConfigError);
  EXPECT_TRUE(contains(message_of([] { open_dataset("jsnol", "x"); }), "did you mean 'jsonl'"));
  // load_dataset still reads a streamed corpus whole, for small ones.
  write_file(dir_ / "a.txt", "whole");
  const std::vector<Document> docs = load_dataset("text", dir_.string());
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_EQ(docs[0].text, "whole");
}

TEST_F(CorpusDir, BadTextInputNamesTheFile) {
  const std::string missing = message_of([&] { open_corpus(path("nope"), CorpusFormat::kText); });
  EXPECT_TRUE(contains(missing, path("nope"))) << missing;
  EXPECT_TRUE(contains(missing, "does not exist")) << missing;
  EXPECT_THROW(open_corpus(path("nope"), CorpusFormat::kText), DataError);

  write_file(dir_ / "only.md", "no txt here");
  const std::string none = message_of([&] { open_corpus(dir_.string(), CorpusFormat::kText); });
  EXPECT_TRUE(contains(none, "holds no .txt files")) << none;

  write_file(dir_ / "empty.txt", "");
  const std::string empty = message_of([&] { open_corpus(dir_.string(), CorpusFormat::kText); });
  EXPECT_TRUE(contains(empty, path("empty.txt") + ": empty file")) << empty;
}

TEST_F(CorpusDir, BadJsonLinesNameFileAndLine) {
  const auto error_for = [&](const std::string& contents) {
    write_file(dir_ / "bad.jsonl", contents);
    return message_of([&] { open_corpus(path("bad.jsonl"), CorpusFormat::kJsonl); });
  };
  const std::string where = path("bad.jsonl");
  std::string msg = error_for("{\"text\": \"ok\"}\n{\"body\": \"no text\"}\n");
  EXPECT_TRUE(contains(msg, where + ":2: no \"text\" field")) << msg;
  EXPECT_TRUE(contains(msg, "dataset_text_field")) << msg;
  msg = error_for("{\"text\": \"ok\"}\n\n{\"text\": \"unterminated}\n");
  EXPECT_TRUE(contains(msg, where + ":3: malformed JSON")) << msg;
  msg = error_for("{\"text\": 42}\n");
  EXPECT_TRUE(contains(msg, where + ":1: field \"text\" is a number")) << msg;
  msg = error_for("[\"text\"]\n");
  EXPECT_TRUE(contains(msg, where + ":1: expected a JSON object")) << msg;
  msg = error_for("");
  EXPECT_TRUE(contains(msg, where + ": empty file")) << msg;
  msg = error_for("\n  \n");
  EXPECT_TRUE(contains(msg, where + ": only blank lines")) << msg;
  write_file(dir_ / "bad.jsonl", "{");
  EXPECT_THROW(open_corpus(where, CorpusFormat::kJsonl), DataError);
}

TEST_F(CorpusDir, TokenFilesRoundTripBothWidths) {
  for (int64_t vocab : {int64_t{258}, int64_t{70000}}) {
    const std::string file = path("t" + std::to_string(vocab) + ".bin");
    const std::vector<std::vector<int64_t>> docs{{1, 2, 3}, {}, {vocab - 1, 0}};
    TokenFileWriter writer(file, vocab);
    for (const auto& d : docs) {
      writer.add_document(d);
    }
    writer.finish();
    TokenFileReader reader(file);
    EXPECT_EQ(reader.token_width(), vocab <= 65536 ? 2 : 4);
    EXPECT_EQ(reader.vocab_size(), vocab);
    EXPECT_EQ(reader.num_documents(), 3);
    EXPECT_EQ(reader.num_tokens(), 5);
    EXPECT_EQ(fs::file_size(file),
              static_cast<uintmax_t>(kTokenFileHeaderBytes + 5 * reader.token_width() + 4 * 8));
    for (size_t i = 0; i < docs.size(); ++i) {
      EXPECT_EQ(reader.document(static_cast<int64_t>(i)), docs[i]);
    }
  }
}

// Hints name the keys of the section the corpus came from (the validation section used to be told
// to fix training.dataset_path).
TEST_F(CorpusDir, HintsNameTheSettingsOfTheirSection) {
  const CorpusSettings validation = CorpusSettings::of_section("validation");
  std::string msg = message_of([&] { open_dataset("auto", path("none"), "text", validation); });
  EXPECT_TRUE(contains(msg, "HINT: set validation.dataset_path to")) << msg;
  write_file(dir_ / "a.md", "x");
  msg = message_of([&] { open_dataset("auto", path("a.md"), "text", validation); });
  EXPECT_TRUE(contains(msg, "name the format: validation.dataset = text")) << msg;
  write_file(dir_ / "d" / "a.jsonl", "{\"body\": \"x\"}\n");
  msg = message_of([&] { open_dataset("jsonl", path("d"), "text", validation); });
  EXPECT_TRUE(contains(msg, "HINT: set validation.dataset_text_field to")) << msg;
  EXPECT_FALSE(contains(msg, "training.")) << msg;
  // The default names the training section.
  msg = message_of([&] { open_dataset("auto", path("none")); });
  EXPECT_TRUE(contains(msg, "HINT: set training.dataset_path to")) << msg;
}

// A file read at open time that disappears later is reported with the reason, not as a mystery.
TEST_F(CorpusDir, FileGoneAfterOpeningSaysWhy) {
  write_file(dir_ / "a.txt", "first");
  write_file(dir_ / "b.jsonl", "{\"text\": \"second\"}\n");
  auto source = open_dataset("auto", dir_.string());
  ASSERT_EQ(source->size(), 2);
  fs::remove(dir_ / "a.txt");
  fs::remove(dir_ / "b.jsonl");
  for (int64_t i = 0; i < 2; ++i) {
    const std::string msg = message_of([&] { source->text(i); });
    EXPECT_TRUE(contains(msg, "No such file or directory")) << msg;
    EXPECT_TRUE(contains(msg, "removed, replaced or made unreadable since")) << msg;
  }
}

TEST_F(CorpusDir, TokenShardsMustShareAVocabulary) {
  for (int64_t vocab : {int64_t{258}, int64_t{300}}) {
    TokenFileWriter writer(path("s" + std::to_string(vocab) + ".bin"), vocab);
    writer.add_document({7});
    writer.finish();
  }
  const std::string msg = message_of([&] { open_corpus(dir_.string(), CorpusFormat::kTokens); });
  EXPECT_TRUE(contains(msg, "vocab_size 300")) << msg;
}

TEST_F(CorpusDir, CorruptTokenFilesNameFileAndOffset) {
  const std::string file = path("c.bin");
  const auto make = [&] {
    TokenFileWriter writer(file, ByteTokenizer::kVocabSize);
    writer.add_document({10, 11, 12});
    writer.add_document({13});
    writer.finish();
  };
  const auto patch = [&](int64_t at, const std::string& bytes) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(at);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  };
  make();
  fs::resize_file(file, fs::file_size(file) - 3);
  std::string msg = message_of([&] { TokenFileReader r(file); });
  EXPECT_TRUE(contains(msg, file + ": truncated")) << msg;
  EXPECT_TRUE(contains(msg, "titan data prepare")) << msg;
  EXPECT_THROW(TokenFileReader r(file), DataError);

  fs::resize_file(file, 10);
  msg = message_of([&] { TokenFileReader r(file); });
  EXPECT_TRUE(contains(msg, "shorter than the 40-byte header")) << msg;

  make();
  patch(0, "X");
  EXPECT_TRUE(contains(message_of([&] { TokenFileReader r(file); }), "bad magic at byte 0"));
  make();
  patch(12, std::string("\x03", 1));
  EXPECT_TRUE(contains(message_of([&] { TokenFileReader r(file); }), "token width 3 at byte 12"));
  make();
  // Offsets start after 4 two-byte tokens; offsets[1] = 3 -> 9 is past num_tokens (4).
  patch(kTokenFileHeaderBytes + 8 + 8, std::string("\x09", 1));
  msg = message_of([&] { TokenFileReader r(file); });
  EXPECT_TRUE(contains(msg, "document offset 1 = 9 at byte 56")) << msg;
  make();
  patch(kTokenFileHeaderBytes + 2, std::string("\xff\xff", 2));  // token 1 of document 0
  // Found when the file is opened (every id is checked then), not when a run reaches it.
  msg = message_of([&] { TokenFileReader r(file); });
  EXPECT_TRUE(contains(msg, "token id 65535 at byte 42 (document 0)")) << msg;

  fs::resize_file(file, 0);
  EXPECT_TRUE(contains(message_of([&] { open_dataset("tokens", file); }), "truncated: 0 bytes"));
}

TEST_F(CorpusDir, LoaderRejectsTokensFromAnotherTokenizer) {
  TokenFileWriter writer(path("v.bin"), /*vocab_size=*/1000);
  writer.add_document({999});
  writer.finish();
  ByteTokenizer tok;
  const std::string msg = message_of([&] {
    DataLoader loader(open_dataset("tokens", path("v.bin")), tok, /*seq_len=*/4, /*batch_size=*/1);
  });
  EXPECT_TRUE(contains(msg, "vocab 1000")) << msg;
  EXPECT_TRUE(contains(msg, "vocab 258")) << msg;
}

}  // namespace test_document_source
}  // namespace titan
