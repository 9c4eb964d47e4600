// The unigram tokenizer and the normalizers on hand-made inputs whose answers can be worked out
// by hand: the Viterbi choice and its ties, fused unknowns, byte fallback, Metaspace words,
// added tokens, NFC, lowercase, grapheme clusters, the precompiled charsmap walked by cluster,
// and the errors of corrupt SentencePiece files. tests/e2e/test_tokenizer_reference.sh checks
// real T5 and CLIP files against transformers.
#include "titan/common/check.h"
#include "titan/components/tokenizer/normalizer.h"
#include "titan/components/tokenizer/tokenizer_files.h"
#include "titan/components/tokenizer/unicode_norm.h"
#include "titan/components/tokenizer/unigram.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <unistd.h>

namespace titan {
namespace test_unigram {

using Ids = std::vector<int64_t>;
const std::string kSp = "\xE2\x96\x81";  // '▁'

UnigramModel small_model() {
  UnigramModel m;
  m.source = "test";
  m.pieces = {{"<pad>", 0.0},     {"</s>", 0.0},       {"<unk>", 0.0}, {kSp, -2.0},
              {kSp + "ab", -3.0}, {"a", -2.5},         {"b", -2.5},    {kSp + "a", -2.0},
              {"c", -4.0},        {kSp + "abc", -9.5}, {"bc", -3.0}};
  m.unk_id = 2;
  m.whitespace_split = true;
  m.added_tokens = {{"<pad>", 0, true, false}, {"</s>", 1, true, false}, {"<unk>", 2, true, false}};
  m.eos_id = 1;
  m.pad_id = 0;
  return m;
}

TEST(Unigram, ViterbiTakesTheBestTotalScore) {
  UnigramTokenizer tok(small_model());
  // "▁ab": ▁ab (-3) beats ▁a + b (-4.5) and ▁ + a + b (-7).
  EXPECT_EQ(tok.encode("ab"), (Ids{4}));
  // "▁abc": ▁a + bc (-5) beats ▁ab + c (-7) and ▁abc (-9.5).
  EXPECT_EQ(tok.encode("abc"), (Ids{7, 10}));
  // Two words, each with its own '▁'; leading, trailing and repeated spaces vanish.
  EXPECT_EQ(tok.encode("  ab \t abc "), (Ids{4, 7, 10}));
  EXPECT_EQ(tok.decode(tok.encode("ab abc")), "ab abc");
}

TEST(Unigram, UnknownCharactersFuseIntoOneToken) {
  UnigramTokenizer tok(small_model());
  // "▁xyzab": '▁' then the unknown run "xyz" (one <unk>) then a, b.
  EXPECT_EQ(tok.encode("xyzab"), (Ids{3, 2, 5, 6}));
  // A multi-byte unknown character is one unit, not three.
  EXPECT_EQ(tok.encode("\xE4\xB8\x96"), (Ids{3, 2}));
}

TEST(Unigram, ByteFallbackSpellsUnknownsAsBytes) {
  UnigramModel m = small_model();
  m.byte_fallback = true;
  for (int b : {0x78, 0x79}) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    m.pieces.emplace_back(name, 0.0);
  }
  UnigramTokenizer tok(m);
  EXPECT_EQ(tok.encode("xy"), (Ids{3, 11, 12}));
  EXPECT_EQ(tok.decode(tok.encode("xy")), "xy");
  // A byte without its token falls back to <unk> for the whole run.
  EXPECT_EQ(tok.encode("xz"), (Ids{3, 2}));
}

TEST(Unigram, AddedTokensSplitTheRawText) {
  UnigramTokenizer tok(small_model());
  EXPECT_EQ(tok.encode("ab</s>ab"), (Ids{4, 1, 4}));
  EXPECT_EQ(tok.decode({4, 1, 4, 0}), "ab ab");  // specials skipped
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.pad_id(), std::optional<int64_t>(0));
  EXPECT_THROW(tok.bos_id(), ConfigError);
}

TEST(Unigram, MetaspaceWithoutWhitespaceSplitKeepsSpacesAsPieces) {
  UnigramModel m = small_model();
  m.whitespace_split = false;
  UnigramTokenizer tok(m);
  // "▁ab▁▁abc" cut before each '▁': "▁ab", "▁", "▁abc".
  EXPECT_EQ(tok.encode("ab  abc"), (Ids{4, 3, 7, 10}));
  m.prepend = UnigramModel::Prepend::kNever;
  EXPECT_EQ(UnigramTokenizer(m).encode("ab"), (Ids{5, 6}));
}

TEST(Unigram, CorruptModelsAreRefused) {
  UnigramModel m = small_model();
  m.pieces[5].second = std::nan("");
  EXPECT_THROW(UnigramTokenizer{m}, DataError);
  m = small_model();
  m.added_tokens.push_back({"<x>", 4, true, false});  // id 4 is "▁ab"
  EXPECT_THROW(UnigramTokenizer{m}, DataError);
}

std::string nfc(std::string_view s) {
  std::string out;
  append_nfc(s, &out);
  return out;
}

TEST(UnicodeNorm, NfcComposesReordersAndKeepsInvalidBytes) {
  EXPECT_EQ(nfc("e\xCC\x81"), "\xC3\xA9");  // e + U+0301 -> é
  EXPECT_EQ(nfc("cafe\xCC\x81!"), "caf\xC3\xA9!");
  EXPECT_EQ(nfc("\xE1\x84\x80\xE1\x85\xA1"), "\xEA\xB0\x80");  // Hangul L + V -> 가
  // a + U+0323 (class 220) + U+0302 (230), in either order: ậ.
  EXPECT_EQ(nfc("a\xCC\x82\xCC\xA3"), "\xE1\xBA\xAD");
  EXPECT_EQ(nfc("a\xCC\xA3\xCC\x82"), "\xE1\xBA\xAD");
  EXPECT_EQ(nfc("\xE2\x84\xAB"), "\xC3\x85");  // Angstrom sign -> Å (singleton)
  EXPECT_EQ(nfc("\xCC\x81"
                "a"),
            "\xCC\x81"
            "a");                                     // a leading mark composes nothing
  EXPECT_EQ(nfc("x\xFFy\xCC\x81"), "x\xFF\xC3\xBD");  // the invalid byte stays
}

TEST(UnicodeNorm, LowercaseMapsEachCodePoint) {
  std::string out;
  append_lowercase("ABC \xC3\x89\xCE\xA3 \xC4\xB0", &out);
  // É -> é, Σ -> σ (no final-sigma context), İ -> i + U+0307.
  EXPECT_EQ(out, "abc \xC3\xA9\xCF\x83 i\xCC\x87");
}

TEST(UnicodeNorm, GraphemeClusters) {
  const auto clusters = [](std::string_view s) {
    std::vector<std::string> out;
    for (size_t pos = 0; pos < s.size();) {
      const size_t end = grapheme_end(s, pos);
      out.emplace_back(s.substr(pos, end - pos));
      pos = end;
    }
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(clusters("e\xCC\x81x"), (V{"e\xCC\x81", "x"}));
  EXPECT_EQ(clusters("\r\n\n"), (V{"\r\n", "\n"}));
  // Man ZWJ woman: one cluster; four regional indicators: two flags.
  EXPECT_EQ(clusters("\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9").size(), 1u);
  EXPECT_EQ(clusters("\xF0\x9F\x87\xAB\xF0\x9F\x87\xB7\xF0\x9F\x87\xA9\xF0\x9F\x87\xAA").size(),
            2u);
  // Hangul jamo L V T: one syllable cluster.
  EXPECT_EQ(clusters("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8").size(), 1u);
  // Devanagari KA + virama + SSA (GB9c): one cluster.
  EXPECT_EQ(clusters("\xE0\xA4\x95\xE0\xA5\x8D\xE0\xA4\xB7").size(), 1u);
}

// A charsmap with the rules "A" -> "a" and "AB" -> "x": the shortest matching key wins, and a
// short cluster is replaced whole.
std::string tiny_charsmap() {
  // darts-clone units, laid out by hand: root (offset 1), 'A' at 1^65 = 64 with a leaf, the
  // leaf of "A" and 'B' below it, and the leaf of "AB".
  std::vector<uint32_t> units(256, 0);
  const auto unit = [](uint32_t label, uint32_t offset, bool leaf) {
    return label | (leaf ? 1u << 8 : 0u) | (offset << 10);
  };
  units[0] = unit(0, 1, false);           // root: children at 1 ^ byte
  units[1 ^ 'A'] = unit('A', 1, true);    // node 'A': children at (64 ^ 1) ^ byte
  const uint32_t a_base = (1 ^ 'A') ^ 1;  // 65
  units[a_base] = (1u << 31) | 0;         // leaf value: pool offset 0 ("a")
  units[a_base ^ 'B'] = unit('B', 1, true);
  units[(a_base ^ 'B') ^ 1] = (1u << 31) | 2;  // leaf value: pool offset 2 ("x")
  std::string blob(4, '\0');
  const uint32_t trie_bytes = static_cast<uint32_t>(units.size() * 4);
  std::memcpy(blob.data(), &trie_bytes, 4);
  blob.append(reinterpret_cast<const char*>(units.data()), trie_bytes);
  blob.append(std::string("a\0x\0", 4));
  return blob;
}

TEST(Precompiled, ShortestRuleByGraphemeCluster) {
  const PrecompiledCharsmap map(tiny_charsmap(), "test");
  const auto run = [&](std::string_view s) {
    std::string out;
    map.normalize(s, &out);
    return out;
  };
  EXPECT_EQ(run("ABC"), "aBC");  // per character: A -> a, no rule for B
  EXPECT_EQ(run("zA"), "za");
  // "A" + U+0301 is one cluster of 3 bytes: its shortest rule ("A") replaces all of it.
  EXPECT_EQ(run("A\xCC\x81!"), "a!");
  EXPECT_THROW(PrecompiledCharsmap(std::string("\x08\0\0\0", 4), "test"), DataError);
}

TEST(Normalizer, UnsupportedStepsAreRefusedNamingThem) {
  const auto message_of = [](const char* spec) -> std::string {
    try {
      TextNormalizer::from_json(nlohmann::json::parse(spec), "tok.json");
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message_of(R"({"type": "NFKC"})").find("unsupported normalizer type 'NFKC'"),
            std::string::npos);
  EXPECT_NE(message_of(R"({"type": "Replace", "pattern": {"Regex": "a+"}, "content": ""})")
                .find("unsupported Replace normalizer pattern"),
            std::string::npos);
  const auto ok = TextNormalizer::from_json(
      nlohmann::json::parse(R"({"type": "Sequence", "normalizers": [{"type": "NFC"},
          {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "},
          {"type": "Lowercase"}, {"type": "Strip", "strip_left": true, "strip_right": true}]})"),
      "tok.json");
  EXPECT_EQ(ok->normalize("  Cafe\xCC\x81 \t\n OK  "), "caf\xC3\xA9 ok");
}

TEST(SentencePieceFile, CorruptFilesNameTheOffset) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("titan_spm_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto write = [&](const std::string& bytes) {
    std::ofstream(dir / "spiece.model", std::ios::binary) << bytes;
    return (dir / "spiece.model").string();
  };
  // One piece "a" (score -1.5, normal), then a piece field that claims 100 bytes.
  const std::string good(
      "\x0A\x0A\x0A\x01"
      "a"
      "\x15\x00\x00\xC0\xBF"
      "\x18\x01",
      12);
  UnigramModel m = read_sentencepiece_model(write(good), 2);
  ASSERT_EQ(m.pieces.size(), 3u);
  EXPECT_EQ(m.pieces[0], std::make_pair(std::string("a"), -1.5));
  EXPECT_EQ(m.pieces[1].first, "<extra_id_1>");
  EXPECT_EQ(m.pieces[2].first, "<extra_id_0>");
  try {
    read_sentencepiece_model(write(good + "\x0A\x64"
                                          "abc"),
                             0);
    ADD_FAILURE() << "a truncated piece was accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("at byte offset 14"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_sentencepiece_model(write("\x0A"), 0), DataError);
  std::filesystem::remove_all(dir);
}

}  // namespace test_unigram
}  // namespace titan
