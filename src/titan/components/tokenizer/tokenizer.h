// Tokenizers turn text into token ids and back. The data loader and generation only see the
// `Tokenizer` interface; `build_tokenizer` picks the implementation from model.hf_assets_path.
// An empty path gives the byte-level tokenizer (no files needed); otherwise byte-level BPE
// (bpe.h) is read from tokenizer.json, GPT-2 vocab.json + merges.txt, or a tiktoken file.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace titan {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of `text`, without BOS/EOS (the data loader adds those per document).
  virtual std::vector<int64_t> encode(std::string_view text) const = 0;
  // Text of `ids`; special tokens (BOS, EOS) are skipped.
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  // Number of distinct ids: every id is in [0, vocab_size()).
  virtual int64_t vocab_size() const = 0;
  virtual int64_t bos_id() const = 0;
  virtual int64_t eos_id() const = 0;
  // The padding id the files name (T5's <pad>, CLIP's <|endoftext|>), if any.
  virtual std::optional<int64_t> pad_id() const { return std::nullopt; }
};

// Ids 0..255 are the raw bytes of the (UTF-8) text, 256 is BOS, 257 is EOS: vocab_size() == 258.
// Any byte string round-trips exactly, so no vocabulary file is needed.
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int64_t kNumBytes = 256;
  static constexpr int64_t kBosId = 256;
  static constexpr int64_t kEosId = 257;
  static constexpr int64_t kVocabSize = 258;

  std::vector<int64_t> encode(std::string_view text) const override;
  // Throws c10::Error on an id outside [0, 258).
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return kVocabSize; }
  int64_t bos_id() const override { return kBosId; }
  int64_t eos_id() const override { return kEosId; }
};

// The tokenizer for model.hf_assets_path: empty -> ByteTokenizer; else a BpeTokenizer from the
// file or folder (see load_bpe_tokenizer in tokenizer_files.h). A missing path or unsupported
// format throws ConfigError; an unreadable or corrupt file throws DataError; both name the file.
std::unique_ptr<Tokenizer> build_tokenizer(const std::string& hf_assets_path);

}  // namespace titan
