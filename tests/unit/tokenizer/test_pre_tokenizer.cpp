// Pre-tokenizer scanners against the regexes they implement: the splits of adversarial strings
// computed by Hugging Face tokenizers' regex engine (pre_tokenizer_cases.json, from
// tests/e2e/tokenizer_reference.py pre-tokenizer-cases), hand-checked cases, and exact coverage of
// arbitrary (invalid UTF-8) bytes.
#include "titan/components/tokenizer/pre_tokenizer.h"
#include "titan/components/tokenizer/unicode.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <random>

namespace titan {
namespace test_pre_tokenizer {

std::vector<std::string> split(PreTokenizer kind, std::string_view text) {
  std::vector<std::string_view> pieces;
  pre_tokenize(kind, text, &pieces);
  return std::vector<std::string>(pieces.begin(), pieces.end());
}

using Pieces = std::vector<std::string>;

TEST(Unicode, Classes) {
  EXPECT_EQ(char_class('a'), kLetter);
  EXPECT_EQ(char_class('7'), kNumber);
  EXPECT_EQ(char_class(' '), kSpace);
  EXPECT_EQ(char_class('\n'), kSpace);
  EXPECT_EQ(char_class('!'), 0);
  EXPECT_EQ(char_class(0x4E16), kLetter);  // 世
  EXPECT_EQ(char_class(0x216B), kNumber);  // Roman numeral twelve (Nl)
  EXPECT_EQ(char_class(0x3000), kSpace);   // ideographic space
  EXPECT_EQ(char_class(0x0301), 0);        // combining acute accent (Mn)
  EXPECT_EQ(char_class(0x1F642), 0);       // emoji
  EXPECT_EQ(char_class(kInvalidCodePoint), 0);
}

// \s is Unicode White_Space, as in the regex engines of tokenizers and tiktoken (and Python's):
// NEL is a space, the byte order mark is not (JavaScript's \s has it the other way round, which
// the tables once followed). Letters follow the Unicode version of those pinned libraries.
TEST(Unicode, ClassesFollowTheReferenceRegexEngines) {
  EXPECT_EQ(char_class(0x85), kSpace);      // NEXT LINE (NEL)
  EXPECT_EQ(char_class(0xFEFF), 0);         // ZERO WIDTH NO-BREAK SPACE (BOM)
  EXPECT_EQ(char_class(0x180E), 0);         // MONGOLIAN VOWEL SEPARATOR, no space since 6.3
  EXPECT_EQ(char_class(0x200B), 0);         // ZERO WIDTH SPACE
  EXPECT_EQ(char_class(0x1C), 0);           // FILE SEPARATOR (Python's str.isspace() says yes)
  EXPECT_EQ(char_class(0x10D4A), kLetter);  // a Garay letter (Unicode 16.0)
  EXPECT_EQ(char_class(0x10940), 0);        // a Sidetic letter (Unicode 17.0, not yet theirs)
}

TEST(PreTokenizer, NextLineIsSpaceByteOrderMarkIsNot) {
  const std::string nel = "\xc2\x85";
  const std::string bom = "\xef\xbb\xbf";
  EXPECT_EQ(split(PreTokenizer::kGpt2, "a" + nel + nel + "b"), (Pieces{"a", nel, nel, "b"}));
  EXPECT_EQ(split(PreTokenizer::kGpt2, "x\n\n" + bom + "y"), (Pieces{"x", "\n", "\n", bom, "y"}));
  EXPECT_EQ(split(PreTokenizer::kLlama3, "a" + nel + nel + "b"), (Pieces{"a", nel, nel + "b"}));
  EXPECT_EQ(split(PreTokenizer::kLlama3, "x\n\n" + bom + "y"), (Pieces{"x", "\n\n", bom + "y"}));
}

TEST(Unicode, DecodeUtf8RejectsMalformed) {
  size_t len = 0;
  EXPECT_EQ(decode_utf8("\xe4\xb8\x96", 0, &len), 0x4E16u);
  EXPECT_EQ(len, 3u);
  EXPECT_EQ(decode_utf8("\xc0\xaf", 0, &len), kInvalidCodePoint);  // overlong '/'
  EXPECT_EQ(len, 1u);
  EXPECT_EQ(decode_utf8("\xed\xa0\x80", 0, &len), kInvalidCodePoint);      // surrogate
  EXPECT_EQ(decode_utf8("\xe4\xb8", 0, &len), kInvalidCodePoint);          // truncated
  EXPECT_EQ(decode_utf8("\xf4\x90\x80\x80", 0, &len), kInvalidCodePoint);  // > U+10FFFF
  EXPECT_EQ(decode_utf8("\x80", 0, &len), kInvalidCodePoint);
}

TEST(PreTokenizer, Gpt2HandChecked) {
  EXPECT_EQ(split(PreTokenizer::kGpt2, "Hello  world\n"), (Pieces{"Hello", " ", " world", "\n"}));
  EXPECT_EQ(split(PreTokenizer::kGpt2, "it's 2024!!"), (Pieces{"it", "'s", " 2024", "!!"}));
  EXPECT_EQ(split(PreTokenizer::kGpt2, "a \n\n b"), (Pieces{"a", " \n\n", " b"}));
}

TEST(PreTokenizer, Llama3HandChecked) {
  EXPECT_EQ(split(PreTokenizer::kLlama3, "It'S 12345 (ok)\n\n  x"),
            (Pieces{"It", "'S", " ", "123", "45", " (", "ok", ")\n\n", " ", " x"}));
  EXPECT_EQ(split(PreTokenizer::kLlama3, "a \n \n  b"), (Pieces{"a", " \n \n", " ", " b"}));
}

TEST(PreTokenizer, MatchesRegexOnAdversarialStrings) {
  const auto path = std::filesystem::path(__FILE__).parent_path() / "pre_tokenizer_cases.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot open " << path;
  const nlohmann::json cases = nlohmann::json::parse(in);
  ASSERT_GT(cases.size(), 400u);
  for (const auto& c : cases) {
    const std::string text = c.at("text").get<std::string>();
    EXPECT_EQ(split(PreTokenizer::kGpt2, text), c.at("gpt2").get<Pieces>()) << "gpt2: " << c;
    EXPECT_EQ(split(PreTokenizer::kLlama3, text), c.at("llama3").get<Pieces>()) << "llama3: " << c;
  }
}

TEST(PreTokenizer, PiecesCoverArbitraryBytes) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text(rng() % 40, '\0');
    for (char& ch : text) ch = static_cast<char>(rng() % 256);
    for (PreTokenizer kind : {PreTokenizer::kGpt2, PreTokenizer::kLlama3}) {
      std::string joined;
      for (const std::string& piece : split(kind, text)) {
        ASSERT_FALSE(piece.empty());
        joined += piece;
      }
      ASSERT_EQ(joined, text);
    }
  }
}

TEST(PreTokenizer, PatternRoundTrip) {
  for (PreTokenizer kind : {PreTokenizer::kGpt2, PreTokenizer::kLlama3}) {
    EXPECT_EQ(pre_tokenizer_from_pattern(pre_tokenizer_pattern(kind)), kind);
  }
  EXPECT_FALSE(pre_tokenizer_from_pattern("\\w+").has_value());
}

}  // namespace test_pre_tokenizer
}  // namespace titan
