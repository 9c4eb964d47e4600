// Byte tokenizer: exact round trips (ASCII, UTF-8, every byte), special tokens, and the factory.
#include "titan/common/check.h"
#include "titan/components/tokenizer/tokenizer.h"

#include <gtest/gtest.h>

namespace titan {
namespace test_tokenizer {

TEST(ByteTokenizer, SizesAndSpecialIds) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 258);
  EXPECT_EQ(tok.bos_id(), 256);
  EXPECT_EQ(tok.eos_id(), 257);
}

TEST(ByteTokenizer, EncodesRawBytes) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.encode("Ab "), (std::vector<int64_t>{65, 98, 32}));
  EXPECT_TRUE(tok.encode("").empty());
  // "é" is two UTF-8 bytes; ids are the unsigned byte values.
  EXPECT_EQ(tok.encode("\xc3\xa9"), (std::vector<int64_t>{0xc3, 0xa9}));
}

TEST(ByteTokenizer, RoundTripsUtf8) {
  ByteTokenizer tok;
  // "é", "世界" and an emoji: 2-, 3- and 4-byte UTF-8 sequences.
  const std::string text =
      "Fellow-Citizens: h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x99\x82\n";
  const std::vector<int64_t> ids = tok.encode(text);
  EXPECT_EQ(ids.size(), text.size());
  EXPECT_EQ(tok.decode(ids), text);
}

TEST(ByteTokenizer, RoundTripsEveryByte) {
  ByteTokenizer tok;
  std::string text;
  for (int b = 0; b < 256; ++b) {
    text.push_back(static_cast<char>(b));
  }
  const std::vector<int64_t> ids = tok.encode(text);
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(ids[b], b);
  }
  EXPECT_EQ(tok.decode(ids), text);
}

TEST(ByteTokenizer, DecodeSkipsSpecials) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.decode({256, 104, 105, 257, 256, 33, 257}), "hi!");
  EXPECT_EQ(tok.decode({256, 257}), "");
}

TEST(ByteTokenizer, DecodeRejectsOutOfRangeIds) {
  ByteTokenizer tok;
  EXPECT_THROW(tok.decode({258}), c10::Error);
  EXPECT_THROW(tok.decode({-1}), c10::Error);
}

TEST(BuildTokenizer, EmptyPathGivesByteTokenizer) {
  std::unique_ptr<Tokenizer> tok = build_tokenizer("");
  ASSERT_NE(dynamic_cast<ByteTokenizer*>(tok.get()), nullptr);
  EXPECT_EQ(tok->vocab_size(), 258);
}

TEST(BuildTokenizer, MissingAssetsPathNamesTheKey) {
  try {
    build_tokenizer("/models/llama3");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.hf_assets_path"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("leave it empty"), std::string::npos);
  }
}

}  // namespace test_tokenizer
}  // namespace titan
