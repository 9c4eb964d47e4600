// BpeTrainer on small synthetic corpora: the merges of a hand-checked corpus (including the
// tie-break), early stop, byte-identical output across runs, that the written tokenizer.json loads
// through build_tokenizer and round-trips text and random bytes, compression of the training text,
// and the usage errors (too small a vocabulary, missing input).
#include "titan/common/check.h"
#include "titan/components/tokenizer/bpe_trainer.h"
#include "titan/components/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <unistd.h>

namespace titan {
namespace test_bpe_trainer {

namespace fs = std::filesystem;
using Merges = std::vector<std::pair<std::string, std::string>>;

class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = fs::temp_directory_path() / ("titan_bpe_trainer_test_" + std::to_string(::getpid()) +
                                         "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string path(const std::string& name = "") const {
    return name.empty() ? path_.string() : (path_ / name).string();
  }

 private:
  fs::path path_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

void write_file(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

// The merges of `result` as (left bytes, right bytes).
Merges merge_strings(const BpeTrainResult& result) {
  Merges out;
  for (const auto& [l, r] : result.merges) out.emplace_back(result.tokens[l], result.tokens[r]);
  return out;
}

BpeTrainResult train_on(const std::string& text, int64_t vocab_size) {
  BpeTrainer trainer;
  trainer.add_text(text);
  BpeTrainerOptions options;
  options.vocab_size = vocab_size;
  return trainer.train(options);
}

// A few thousand words of English-like text from a fixed seed.
std::string synthetic_corpus() {
  const std::vector<std::string> words = {
      "the",   "state", "of",     "union", "is",     "strong",  "and",   "our",    "nation",
      "will",  "grow",  "people", "work",  "hard",   "for",     "their", "future", "in",
      "peace", "we",    "shall",  "build", "roads,", "schools", "1789",  "2024.",  "café"};
  std::mt19937 rng(7);
  std::string text;
  for (int i = 0; i < 4000; ++i) {
    text += words[rng() % words.size()];
    text += (i % 13 == 12) ? "\n" : " ";
  }
  return text;
}

TEST(BpeTrainer, HandCheckedMerges) {
  // Pre-tokens "aaab" and " aaab". Pair counts: (a,a) 4, (a,b) 2, (' ',a) 1 -> merge "a a".
  // Then (aa,a) 2 and (a,b) 2 tie; "a" < "aa" so "a b" wins. Then "aa ab" (2), " aaab" (1).
  const BpeTrainResult result = train_on("aaab aaab", 256 + 4 + 2);
  const Merges expected = {{"a", "a"}, {"a", "b"}, {"aa", "ab"}, {" ", "aaab"}};
  EXPECT_EQ(merge_strings(result), expected);
  ASSERT_EQ(result.tokens.size(), 260u);
  EXPECT_EQ(result.tokens[256], "aa");
  EXPECT_EQ(result.tokens[259], " aaab");
  ASSERT_EQ(result.special_tokens.size(), 2u);
  EXPECT_EQ(result.special_tokens[0],
            std::make_pair(std::string("<|begin_of_text|>"), int64_t{260}));
  EXPECT_EQ(result.special_tokens[1], std::make_pair(std::string("<|end_of_text|>"), int64_t{261}));
  // The JSON spells the space as GPT-2's "Ġ".
  const std::string json = bpe_tokenizer_json(result);
  EXPECT_NE(json.find("\"Ġ aaab\""), std::string::npos);
  EXPECT_NE(json.find("\"aa ab\""), std::string::npos);
}

TEST(BpeTrainer, VocabSizeLimitsMerges) {
  const BpeTrainResult two = train_on("aaab aaab", 256 + 2 + 2);
  EXPECT_EQ(merge_strings(two), (Merges{{"a", "a"}, {"a", "b"}}));
  // No pair is left after four merges: training stops with a smaller vocabulary.
  const BpeTrainResult all = train_on("aaab aaab", 1000);
  EXPECT_EQ(all.merges.size(), 4u);
  EXPECT_EQ(all.special_tokens.back().second, 261);
}

TEST(BpeTrainer, CountsWordFrequencies) {
  // Pre-tokens " ab" x3, " cd" x2, "ef" x1. (a,b) and (' ',a) tie at 3: "a" < "Ġ" takes (a,b);
  // then (' ',ab) 3; then (c,d) and (' ',c) tie at 2: "c" < "Ġ".
  const BpeTrainResult result = train_on("ef cd ab cd ab ab", 256 + 3 + 2);
  EXPECT_EQ(merge_strings(result), (Merges{{"a", "b"}, {" ", "ab"}, {"c", "d"}}));
}

TEST(BpeTrainer, Deterministic) {
  const std::string text = synthetic_corpus();
  const std::string first = bpe_tokenizer_json(train_on(text, 400));
  const std::string second = bpe_tokenizer_json(train_on(text, 400));
  EXPECT_EQ(first, second);
  TempDir a, b;
  write_bpe_tokenizer_json(train_on(text, 400), a.path());
  write_bpe_tokenizer_json(train_on(text, 400), b.path());
  EXPECT_EQ(read_file(a.path("tokenizer.json")), read_file(b.path("tokenizer.json")));
  EXPECT_EQ(read_file(a.path("tokenizer.json")), first);
  // Only tokenizer.json is left: the temp file was renamed.
  EXPECT_EQ(std::distance(fs::directory_iterator(a.path()), fs::directory_iterator()), 1);
}

TEST(BpeTrainer, LoadsAndRoundTrips) {
  const std::string text = synthetic_corpus();
  TempDir dir;
  const BpeTrainResult result = train_on(text, 320);
  ASSERT_EQ(result.tokens.size(), 318u);
  write_bpe_tokenizer_json(result, dir.path());
  const std::unique_ptr<Tokenizer> tok = build_tokenizer(dir.path());
  EXPECT_EQ(tok->vocab_size(), 320);
  EXPECT_EQ(tok->bos_id(), 318);
  EXPECT_EQ(tok->eos_id(), 319);

  const std::vector<int64_t> ids = tok->encode(text);
  EXPECT_EQ(tok->decode(ids), text);
  EXPECT_LT(ids.size(), text.size() / 2);  // learned merges compress the training text

  for (const std::string& s : {std::string("unseen words: zebra, ünïcödé ✓ 42\n\t"), std::string(),
                               std::string(" the state of the union ")}) {
    EXPECT_EQ(tok->decode(tok->encode(s)), s);
  }
  std::mt19937 rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    std::string bytes(rng() % 200, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() & 0xFF);
    EXPECT_EQ(tok->decode(tok->encode(bytes)), bytes);
  }
  // Special-token text encodes to the special id.
  EXPECT_EQ(tok->encode("<|end_of_text|>"), std::vector<int64_t>{319});
}

TEST(BpeTrainer, ListsTxtFilesRecursivelySorted) {
  TempDir dir;
  write_file(dir.path("b.txt"), "b");
  write_file(dir.path("a/z.txt"), "z");
  write_file(dir.path("a/skip.json"), "{}");
  write_file(dir.path("other.md"), "md");
  const std::vector<std::string> files = list_training_files({dir.path(), dir.path("other.md")});
  EXPECT_EQ(files, (std::vector<std::string>{dir.path("a/z.txt"), dir.path("b.txt"),
                                             dir.path("other.md")}));
}

TEST(BpeTrainer, Errors) {
  BpeTrainer trainer;
  trainer.add_text("hello");
  BpeTrainerOptions options;
  options.vocab_size = 257;
  EXPECT_THROW(trainer.train(options), ConfigError);
  options.vocab_size = 258;
  EXPECT_NO_THROW(trainer.train(options));
  EXPECT_THROW(list_training_files({"/nonexistent/titan_corpus"}), ConfigError);
  EXPECT_THROW(list_training_files({}), ConfigError);
  TempDir empty;
  EXPECT_THROW(list_training_files({empty.path()}), ConfigError);
}

}  // namespace test_bpe_trainer
}  // namespace titan
