// SentencePiece's unigram language-model tokenizer (T5's), as Hugging Face runs it: added tokens
// are split out of the raw text, each remaining segment is normalized (normalizer.h), split at
// white space, turned into Metaspace words ('▁' for spaces, one prepended), and each word is
// cut into the pieces of highest total score (Viterbi over the vocabulary; characters no piece
// covers become the unknown token, consecutive ones fused). `UnigramModel` is the loaded
// vocabulary (tokenizer_files.h reads tokenizer.json and SentencePiece's spiece.model).
#pragma once

#include "titan/components/tokenizer/normalizer.h"
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

struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool special = true;      // skipped by decode
  bool normalized = false;  // matched in the normalized text instead of the raw text
};

struct UnigramModel {
  std::vector<std::pair<std::string, double>> pieces;  // by id: (piece, log-probability score)
  std::optional<int64_t> unk_id;
  // Pieces no vocabulary entry covers become their bytes' <0xXX> tokens instead of unk.
  bool byte_fallback = false;
  std::shared_ptr<const TextNormalizer> normalizer;
  // Pre-tokenization: WhitespaceSplit first (T5's current files), then Metaspace.
  bool whitespace_split = false;
  enum class Prepend { kAlways, kFirst, kNever };
  Prepend prepend = Prepend::kAlways;
  bool split_on_replacement = true;  // words are cut before each '▁'
  std::vector<AddedToken> added_tokens;
  std::optional<int64_t> bos_id;
  std::optional<int64_t> eos_id;
  std::optional<int64_t> pad_id;
  std::string source;  // the file, for messages
};

class UnigramTokenizer final : public Tokenizer {
 public:
  // Throws DataError (naming model.source) for an empty vocabulary, a non-finite score, an id
  // out of range or an added token whose id names another vocabulary piece.
  explicit UnigramTokenizer(UnigramModel model);
  // raw_added_ / normalized_added_ point into model_: not copyable.
  UnigramTokenizer(const UnigramTokenizer&) = delete;
  UnigramTokenizer& operator=(const UnigramTokenizer&) = delete;

  std::vector<int64_t> encode(std::string_view text) const override;
  // Pieces joined, '▁' as spaces, the prepended space dropped; special tokens are skipped.
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  // ConfigError when the files define none (T5 has no BOS).
  int64_t bos_id() const override;
  int64_t eos_id() const override;
  std::optional<int64_t> pad_id() const override { return model_.pad_id; }
  const UnigramModel& model() const { return model_; }

 private:
  struct TrieNode {
    int32_t id = -1;                                          // the piece ending here
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
  };
  void encode_segment(std::string_view text, bool at_start, std::vector<int64_t>* ids) const;
  void encode_word(std::string_view word, std::vector<int64_t>* ids) const;
  void add_unknown(std::string_view text, std::vector<int64_t>* ids) const;
  int32_t child(int32_t node, unsigned char byte) const;

  UnigramModel model_;
  int64_t vocab_size_ = 0;
  std::vector<TrieNode> trie_;
  std::unordered_map<std::string, int32_t> piece_ids_;
  std::vector<bool> is_special_;
  double unk_score_ = 0.0;
  std::vector<const AddedToken*> raw_added_;         // longest first
  std::vector<const AddedToken*> normalized_added_;  // longest first
  std::array<int32_t, 256> byte_tokens_{};           // <0xXX> ids for byte_fallback, or -1
};

}  // namespace titan
