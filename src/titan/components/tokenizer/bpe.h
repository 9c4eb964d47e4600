// Byte-level BPE as used by GPT-2, Llama 3 and most Hugging Face models: pre-tokenize with a
// regex-equivalent scanner, then merge each piece's bytes by rank. `BpeModel` is the loaded
// vocabulary (see tokenizer_files.h for the file formats); `BpeTokenizer` encodes and decodes.
#pragma once

#include "titan/components/tokenizer/normalizer.h"
#include "titan/components/tokenizer/pre_tokenizer.h"
#include "titan/components/tokenizer/tokenizer.h"

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace titan {

struct BpeModel {
  // Ids index dense tables (`tokens`, the tokenizer's id -> bytes), so a file may leave at most
  // this many ids unused: a corrupt id such as 2^30 is rejected instead of allocating for it.
  static constexpr int64_t kMaxUnusedIds = int64_t{1} << 16;

  // Raw bytes of each ordinary token, by id ("" marks an unused id).
  std::vector<std::string> tokens;
  // Merge rules in rank order (lowest first) as (left id, right id); the merged token is the
  // concatenation, which must be in `tokens`. Unused when merges_from_ranks.
  std::vector<std::pair<int32_t, int32_t>> merges;
  // tiktoken: a token's id is its rank, and any two adjacent parts whose concatenation is a token
  // may merge (lowest rank first).
  bool merges_from_ranks = false;
  // A piece that is itself a token becomes that id without merging (tiktoken, Llama 3 HF files).
  bool ignore_merges = false;
  PreTokenizer pre_tokenizer = PreTokenizer::kGpt2;
  // Hugging Face ByteLevel(add_prefix_space): text not starting with ' ' gets one prepended.
  bool add_prefix_space = false;
  // Applied to the text between special tokens before pre-tokenizing (CLIP: NFC, white-space
  // runs to one space, lowercase); null for none.
  std::shared_ptr<const TextNormalizer> normalizer;
  // Appended to the last byte of each piece before merging (CLIP's "</w>"): the vocabulary
  // holds every byte also with the suffix, and words end in suffixed tokens.
  std::string end_of_word_suffix;
  // Special / added tokens: content and id (ids may lie past `tokens`).
  std::vector<std::pair<std::string, int64_t>> special_tokens;
  // Whether special-token text inside the input encodes to the special id (Hugging Face) or as
  // ordinary text (tiktoken's encode_ordinary, the GPT-2 reference encoder).
  bool match_special_tokens = false;
  std::optional<int64_t> bos_id;
  std::optional<int64_t> eos_id;
  std::optional<int64_t> pad_id;
  // The file the model came from, for error messages.
  std::string source;
};

class BpeTokenizer final : public Tokenizer {
 public:
  // Throws DataError (naming model.source) when the model is inconsistent: a missing single-byte
  // token, a merge whose result is not a token, duplicate ids.
  explicit BpeTokenizer(BpeModel model);

  std::vector<int64_t> encode(std::string_view text) const override;
  // Concatenated token bytes; BOS/EOS are skipped. Throws c10::Error on an unknown id.
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_bytes_.size()); }
  // Throw ConfigError when the files define no BOS/EOS token.
  int64_t bos_id() const override;
  int64_t eos_id() const override;
  std::optional<int64_t> pad_id() const override { return model_.pad_id; }

  // The raw bytes of token `id` (special tokens: their text). Throws c10::Error when unknown.
  const std::string& token_bytes(int64_t id) const;
  const BpeModel& model() const { return model_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t id;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  void build_merges();
  void encode_ordinary(std::string_view text, std::vector<int64_t>* ids) const;
  void encode_piece(std::string_view piece, std::vector<int64_t>* ids) const;
  void merge_piece(std::string_view piece, std::vector<int32_t>* parts) const;

  BpeModel model_;
  std::vector<std::string> id_to_bytes_;
  std::vector<bool> id_known_;
  std::unordered_map<std::string, int32_t> token_to_id_;
  std::array<int32_t, 256> byte_ids_{};
  std::array<int32_t, 256> suffixed_byte_ids_{};  // byte + end_of_word_suffix
  std::unordered_map<uint64_t, Merge> merges_;
  // Special tokens grouped by first byte, longest first, for matching inside text.
  std::array<std::vector<std::pair<std::string, int64_t>>, 256> specials_by_byte_;

  // Names this tokenizer's entries in the per-thread piece cache (bpe.cpp); never reused.
  uint64_t cache_owner_ = 0;
};

}  // namespace titan
