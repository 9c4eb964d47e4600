// BpeTokenizer on small synthetic tokenizer files in every supported format (tokenizer.json with
// string or pair merges and a Sequence pre-tokenizer, GPT-2 vocab.json + merges.txt, tiktoken),
// special tokens, BOS/EOS, exact round trips of random bytes, and the file errors. When the
// GPT-2 files fetched by scripts/fetch_gpt2_tokenizer.sh are present, also the real vocabulary.
#include "titan/common/check.h"
#include "titan/components/tokenizer/bpe.h"
#include "titan/components/tokenizer/tokenizer_files.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

namespace titan {
namespace test_bpe {

namespace fs = std::filesystem;
using nlohmann::json;
using Ids = std::vector<int64_t>;

// GPT-2's printable spelling of raw bytes (the inverse of what the readers undo).
std::string to_byte_level(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) {
    int cp = b;
    if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
      int n = 0;
      for (int c = 0; c < b; ++c) {
        if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE)) ++n;
      }
      cp = 256 + n;
    }
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return out;
}

// Ids 0..255: bytes; then the merges below, each producing the next id.
const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"h", "e"},  {"l", "l"},  {"he", "ll"}, {"hell", "o"},  {" ", "w"},
    {" w", "o"}, {"r", "ld"}, {"l", "d"},   {" wo", "rld"}, {"1", "2"}};

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("titan_bpe_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    const fs::path p = path_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

json byte_level_vocab() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[to_byte_level(std::string(1, static_cast<char>(b)))] = b;
  int next = 256;
  for (const auto& [a, b] : kMerges) vocab[to_byte_level(a + b)] = next++;
  return vocab;
}

json hf_json(bool pair_merges, const json& pre_tokenizer) {
  json merges = json::array();
  for (const auto& [a, b] : kMerges) {
    if (pair_merges) {
      merges.push_back({to_byte_level(a), to_byte_level(b)});
    } else {
      merges.push_back(to_byte_level(a) + " " + to_byte_level(b));
    }
  }
  json root;
  root["normalizer"] = nullptr;
  root["pre_tokenizer"] = pre_tokenizer;
  root["added_tokens"] =
      json::array({{{"id", 300}, {"content", "<|begin_of_text|>"}, {"special", true}},
                   {{"id", 301}, {"content", "<|end_of_text|>"}, {"special", true}}});
  root["model"] = {{"type", "BPE"}, {"vocab", byte_level_vocab()}, {"merges", merges}};
  return root;
}

const json kByteLevel = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};

json llama3_sequence() {
  return {{"type", "Sequence"},
          {"pretokenizers",
           json::array({{{"type", "Split"},
                         {"pattern", {{"Regex", pre_tokenizer_pattern(PreTokenizer::kLlama3)}}},
                         {"behavior", "Isolated"},
                         {"invert", false}},
                        {{"type", "ByteLevel"}, {"use_regex", false}}})}};
}

void expect_round_trips(const Tokenizer& tok) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text(rng() % 64, '\0');
    for (char& ch : text) ch = static_cast<char>(rng() % 256);
    const Ids ids = tok.encode(text);
    for (int64_t id : ids) ASSERT_TRUE(id >= 0 && id < tok.vocab_size());
    ASSERT_EQ(tok.decode(ids), text);
  }
}

std::string base64(const std::string& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = static_cast<unsigned char>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) v |= static_cast<unsigned char>(bytes[i + 2]);
    for (size_t k = 0; k < 4; ++k) {
      out.push_back(k <= bytes.size() - i ? kAlphabet[(v >> (18 - 6 * k)) & 63] : '=');
    }
  }
  return out;
}

TEST(BpeTokenizer, HfJsonStringMerges) {
  TempDir dir;
  const std::string path = dir.write("tokenizer.json", hf_json(false, kByteLevel).dump());
  std::unique_ptr<Tokenizer> tok = build_tokenizer(dir.path());
  ASSERT_NE(dynamic_cast<BpeTokenizer*>(tok.get()), nullptr);
  EXPECT_EQ(tok->vocab_size(), 302);
  EXPECT_EQ(tok->bos_id(), 300);
  EXPECT_EQ(tok->eos_id(), 301);
  // "hello" merges fully; " hello" has no (' ', hello) rule; " world" = " wo" + "rld".
  EXPECT_EQ(tok->encode("hello hello world"), (Ids{259, 32, 259, 264}));
  EXPECT_EQ(tok->encode("<|begin_of_text|>hello<|end_of_text|>"), (Ids{300, 259, 301}));
  EXPECT_EQ(tok->decode({300, 259, 32, 259, 264, 301}), "hello hello world");
  expect_round_trips(*tok);
  // The file itself works as the path too, and pair-style merges read the same.
  EXPECT_EQ(build_tokenizer(path)->encode("hello world"), (Ids{259, 264}));
  TempDir pairs;
  pairs.write("tokenizer.json", hf_json(true, kByteLevel).dump());
  EXPECT_EQ(build_tokenizer(pairs.path())->encode("hello hello world"), (Ids{259, 32, 259, 264}));
}

TEST(BpeTokenizer, HfJsonLlama3Sequence) {
  TempDir dir;
  dir.write("tokenizer.json", hf_json(false, llama3_sequence()).dump());
  std::unique_ptr<Tokenizer> tok = build_tokenizer(dir.path());
  // Llama-3 splits digits in threes: "12" + "3".
  EXPECT_EQ(tok->encode("123 world"), (Ids{265, '3', 264}));
  expect_round_trips(*tok);
}

TEST(BpeTokenizer, Gpt2VocabAndMerges) {
  TempDir dir;
  json vocab = byte_level_vocab();
  vocab["<|endoftext|>"] = 266;
  dir.write("vocab.json", vocab.dump());
  std::string merges = "#version: 0.2\n";
  for (const auto& [a, b] : kMerges) merges += to_byte_level(a) + " " + to_byte_level(b) + "\n";
  dir.write("merges.txt", merges);
  std::unique_ptr<Tokenizer> tok = build_tokenizer(dir.path());
  EXPECT_EQ(tok->bos_id(), 266);
  EXPECT_EQ(tok->eos_id(), 266);
  EXPECT_EQ(tok->encode("hello world"), (Ids{259, 264}));
  expect_round_trips(*tok);
}

TEST(BpeTokenizer, TiktokenMatchesMerges) {
  // Same vocabulary as rank lines: each merged token's rank is its id.
  std::string ranks;
  for (int b = 0; b < 256; ++b)
    ranks += base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  int next = 256;
  for (const auto& [a, b] : kMerges) ranks += base64(a + b) + " " + std::to_string(next++) + "\n";
  TempDir dir;
  const std::string path = dir.write("tokenizer.model", ranks);
  std::unique_ptr<Tokenizer> tok = build_tokenizer(path);
  EXPECT_EQ(tok->vocab_size(), 266);
  EXPECT_EQ(tok->encode("hello world 123"), (Ids{259, 264, 32, 265, '3'}));
  expect_round_trips(*tok);
  // Not Llama 3's 128000 ranks: no special tokens, so no BOS/EOS.
  EXPECT_THROW(tok->bos_id(), ConfigError);
  EXPECT_THROW(tok->eos_id(), ConfigError);
  EXPECT_EQ(build_tokenizer(dir.path())->encode("hello"), (Ids{259}));
}

TEST(BpeTokenizer, TiktokenWithLlama3RankCountGetsSpecialTokens) {
  // 128000 ranks like Llama 3's tokenizer.model: bytes, all byte pairs, then byte triples.
  std::string ranks;
  int64_t rank = 0;
  const auto add = [&](const std::string& bytes) {
    ranks += base64(bytes) + " " + std::to_string(rank++) + "\n";
  };
  for (int a = 0; a < 256; ++a) add(std::string(1, static_cast<char>(a)));
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; ++b) add({static_cast<char>(a), static_cast<char>(b)});
  }
  for (int a = 0; rank < 128000; ++a) {
    for (int b = 0; b < 256 && rank < 128000; ++b) {
      add({'x', static_cast<char>(a), static_cast<char>(b)});
    }
  }
  TempDir dir;
  dir.write("original/tokenizer.model", ranks);
  std::unique_ptr<Tokenizer> tok = build_tokenizer(dir.path());
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->bos_id(), 128000);
  EXPECT_EQ(tok->eos_id(), 128001);
  // tiktoken's encode_ordinary: special-token text is ordinary text.
  EXPECT_GT(tok->encode("<|eot_id|>").size(), 1u);
  EXPECT_EQ(tok->decode({128000, 128009, 128001}), "<|eot_id|>");
  // "xab" is a triple token (rank 65792 + 'a' * 256 + 'b').
  EXPECT_EQ(tok->encode("xab"), (Ids{65792 + 'a' * 256 + 'b'}));
  expect_round_trips(*tok);
}

TEST(BpeTokenizer, FileErrorsNameTheFile) {
  const auto message_of = [](const std::string& path, bool config_error) -> std::string {
    try {
      build_tokenizer(path);
    } catch (const ConfigError& e) {
      EXPECT_TRUE(config_error) << e.what();
      return e.what();
    } catch (const DataError& e) {
      EXPECT_FALSE(config_error) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "no error for " << path;
    return "";
  };
  TempDir dir;
  EXPECT_NE(message_of(dir.path() + "/nope", true).find("/nope"), std::string::npos);
  EXPECT_NE(message_of(dir.path(), true).find("tokenizer.json"), std::string::npos);
  const std::string bad_json = dir.write("a/tokenizer.json", "{\"model\": [");
  EXPECT_NE(message_of(bad_json, false).find(bad_json), std::string::npos);
  const std::string bad_ranks = dir.write("b/tokenizer.model", "QQ== 0\nnot-base64!! 1\n");
  EXPECT_NE(message_of(bad_ranks, false).find(bad_ranks + ":2"), std::string::npos);
  json unigram = hf_json(false, kByteLevel);
  unigram["model"]["type"] = "Unigram";
  const std::string uni = dir.write("c/tokenizer.json", unigram.dump());
  // A BPE vocabulary under model.type "Unigram": read as unigram, refused as corrupt.
  EXPECT_NE(message_of(uni, false).find("unigram vocabulary entry 0"), std::string::npos);
  unigram["model"]["type"] = "WordPiece";
  const std::string wordpiece = dir.write("c2/tokenizer.json", unigram.dump());
  EXPECT_NE(message_of(wordpiece, true).find("supported: BPE (byte-level) and Unigram"),
            std::string::npos);
  json no_byte = hf_json(false, kByteLevel);
  no_byte["model"]["vocab"].erase("A");
  const std::string missing = dir.write("d/tokenizer.json", no_byte.dump());
  EXPECT_NE(message_of(missing, false).find(missing), std::string::npos);
}

// Found by fuzzing (tests/fuzz, corpus tiktoken/crash-huge-rank.model): ids index dense tables, so
// an id far past the number of entries used to allocate for it (a rank of 2^30: 32 GB of strings;
// an added token id of INT64_MAX overflowed id + 1). Now a DataError naming the id and the file.
TEST(BpeTokenizer, IdsFarPastTheEntriesAreRejected) {
  const auto error_of = [](const std::string& path) -> std::string {
    try {
      build_tokenizer(path);
    } catch (const DataError& e) {
      return e.what();
    }
    ADD_FAILURE() << "no DataError for " << path;
    return "";
  };
  TempDir dir;
  std::string ranks;
  for (int b = 0; b < 256; ++b)
    ranks += base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  const std::string far_rank = dir.write("a/tokenizer.model", ranks + base64("he") + " 10000000\n");
  EXPECT_NE(error_of(far_rank).find(far_rank + ":257: rank 10000000 is too large"),
            std::string::npos);
  // The last id that stays within the unused-id allowance still loads.
  const std::string near_rank =
      dir.write("b/tokenizer.model", ranks + base64("he") + " " +
                                         std::to_string(257 + BpeModel::kMaxUnusedIds - 1) + "\n");
  EXPECT_EQ(build_tokenizer(near_rank)->vocab_size(), 257 + BpeModel::kMaxUnusedIds);

  json far_vocab = hf_json(false, kByteLevel);
  far_vocab["model"]["vocab"]["zz"] = 10000000;
  const std::string vocab_path = dir.write("c/tokenizer.json", far_vocab.dump());
  EXPECT_NE(error_of(vocab_path).find("'zz' has an invalid id 10000000"), std::string::npos);

  json far_added = hf_json(false, kByteLevel);
  far_added["added_tokens"][0]["id"] = INT64_MAX;
  const std::string added_path = dir.write("d/tokenizer.json", far_added.dump());
  EXPECT_NE(error_of(added_path).find("'<|begin_of_text|>' has an invalid id"), std::string::npos);
  // A float id is no id (it was converted to int64 with undefined behaviour).
  far_added["added_tokens"][0]["id"] = 1e300;
  const std::string float_path = dir.write("e/tokenizer.json", far_added.dump());
  EXPECT_NE(error_of(float_path).find("'<|begin_of_text|>' has a non-integer id 1e+300"),
            std::string::npos);
  // An empty special token is named as empty, with its (valid) id, not as an invalid id.
  json empty_added = hf_json(false, kByteLevel);
  const int64_t empty_id = empty_added["added_tokens"][0]["id"].get<int64_t>();
  empty_added["added_tokens"][0]["content"] = "";
  const std::string empty_path = dir.write("f/tokenizer.json", empty_added.dump());
  EXPECT_NE(error_of(empty_path)
                .find("the special token of id " + std::to_string(empty_id) + " is empty"),
            std::string::npos)
      << error_of(empty_path);
}

// An added token at an id the vocabulary already gives another token used to overwrite that token,
// and the load failed later with a misleading "merge rule produces a token that is not in the
// vocabulary". Now it is named for what it is; an added token repeating its vocabulary entry
// (same id, same text, as HF files often do) still loads.
TEST(BpeTokenizer, AddedTokenIdCollisionIsNamed) {
  TempDir dir;
  json taken = hf_json(false, kByteLevel);
  const int64_t he_id = taken["model"]["vocab"]["he"].get<int64_t>();
  taken["added_tokens"][0]["id"] = he_id;
  const std::string path = dir.write("a/tokenizer.json", taken.dump());
  std::string message;
  try {
    build_tokenizer(path);
  } catch (const DataError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("added-token id collision: special token '<|begin_of_text|>' has id " +
                         std::to_string(he_id) +
                         ", which already belongs to vocabulary token "
                         "'he'"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("merge rule"), std::string::npos) << message;

  json twice = hf_json(false, kByteLevel);
  twice["added_tokens"][1]["id"] = twice["added_tokens"][0]["id"];
  const std::string twice_path = dir.write("b/tokenizer.json", twice.dump());
  EXPECT_THROW(build_tokenizer(twice_path), DataError);

  json repeated = hf_json(false, kByteLevel);
  repeated["model"]["vocab"]["<|begin_of_text|>"] = repeated["added_tokens"][0]["id"];
  const std::string repeated_path = dir.write("c/tokenizer.json", repeated.dump());
  EXPECT_NO_THROW(build_tokenizer(repeated_path));
}

// Threads sharing one tokenizer (and its per-piece cache, cold at the start) get the ids that one
// thread gets.
TEST(BpeTokenizer, ConcurrentEncodingMatchesSerial) {
  TempDir dir;
  dir.write("tokenizer.json", hf_json(false, kByteLevel).dump());
  const std::vector<std::string> words = {"hello", " world", " hell", "o",  " 12", "3",
                                          " wo",   "rld",    "\n",    "  ", "ll",  " x"};
  std::mt19937 rng(7);
  std::vector<std::string> texts(300);
  for (std::string& text : texts) {
    for (int i = rng() % 40; i > 0; --i) text += words[rng() % words.size()];
  }
  std::vector<Ids> serial;
  for (const std::string& text : texts) serial.push_back(build_tokenizer(dir.path())->encode(text));
  const std::unique_ptr<Tokenizer> shared = build_tokenizer(dir.path());
  std::vector<std::vector<Ids>> got(4, std::vector<Ids>(texts.size()));
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < texts.size(); ++i) {
        // Each thread in its own order: strides coprime to 300 visit every text once.
        const size_t stride[] = {1, 7, 11, 13};
        const size_t k = (i * stride[t] + t) % texts.size();
        got[t][k] = shared->encode(texts[k]);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (size_t t = 0; t < got.size(); ++t) EXPECT_EQ(got[t], serial) << "thread " << t;
}

// Piece caches are per thread: tokenizers with different merges taking turns on one thread
// never see each other's entries.
TEST(BpeTokenizer, TokenizersTakingTurnsKeepTheirOwnIds) {
  TempDir merged_dir;
  merged_dir.write("tokenizer.json", hf_json(false, kByteLevel).dump());
  json no_merges = hf_json(false, kByteLevel);
  no_merges["model"]["merges"] = json::array();
  TempDir bytes_dir;
  bytes_dir.write("tokenizer.json", no_merges.dump());
  const std::unique_ptr<Tokenizer> merged = build_tokenizer(merged_dir.path());
  const std::unique_ptr<Tokenizer> bytes = build_tokenizer(bytes_dir.path());
  for (int turn = 0; turn < 3; ++turn) {
    EXPECT_EQ(merged->encode("hello world"), (Ids{259, 264}));
    EXPECT_EQ(bytes->encode("hello world"),
              (Ids{'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'}));
  }
}

// The real GPT-2 vocabulary, when scripts/fetch_gpt2_tokenizer.sh has fetched it.
TEST(BpeTokenizer, Gpt2RealVocabulary) {
  const char* cache = std::getenv("TITAN_CACHE");
  const char* home = std::getenv("HOME");
  const fs::path dir = cache ? fs::path(cache) / "tokenizers/gpt2"
                             : fs::path(home ? home : "/") / ".cache/titan/tokenizers/gpt2";
  if (!fs::exists(dir / "encoder.json")) GTEST_SKIP() << "no GPT-2 files in " << dir;
  std::unique_ptr<Tokenizer> tok = build_tokenizer(dir.string());
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->bos_id(), 50256);
  EXPECT_EQ(tok->encode("Hello world"), (Ids{15496, 995}));
  expect_round_trips(*tok);
}

}  // namespace test_bpe
}  // namespace titan
