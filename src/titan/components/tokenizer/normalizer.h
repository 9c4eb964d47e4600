// Text normalizers of Hugging Face tokenizer.json files, applied to text before pre-tokenizing:
// the ones T5's and CLIP's tokenizers use (SentencePiece's precompiled character map, NFC,
// Lowercase, Replace, Strip), alone or in a Sequence. Each step behaves as the pinned
// `tokenizers` library's (tests/e2e/test_tokenizer_reference.sh compares the token ids).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace titan {

// Appends `text` to *out with every occurrence of `from` (non-empty) replaced by `to`.
void append_replaced(std::string_view text, std::string_view from, std::string_view to,
                     std::string* out);

// SentencePiece's normalization rules (a model's `precompiled_charsmap`): a double-array trie
// (darts-clone) over UTF-8 keys whose values index a pool of NUL-terminated replacements.
// As in Hugging Face's reading of it, text is walked by grapheme cluster: a cluster shorter
// than 6 bytes with a rule for its shortest matching prefix becomes that rule's replacement
// (whole); otherwise each character is replaced by its own rule, if any.
class PrecompiledCharsmap {
 public:
  // Throws DataError naming `source` when `blob` is not a charsmap (sizes, offsets).
  PrecompiledCharsmap(std::string blob, const std::string& source);

  void normalize(std::string_view text, std::string* out) const;

 private:
  // The replacement of the shortest key that prefixes `chunk`, or false when none does.
  bool transform(std::string_view chunk, std::string_view* replacement) const;

  std::vector<uint32_t> trie_;
  std::string pool_;
};

class TextNormalizer {
 public:
  // The normalizer of a tokenizer.json's "normalizer" object (null: none). Unsupported types or
  // patterns throw ConfigError naming `source` and what is supported.
  static std::shared_ptr<const TextNormalizer> from_json(const nlohmann::json& spec,
                                                         const std::string& source);
  // SentencePiece's own normalization as Hugging Face converts a model: the charsmap alone.
  static std::shared_ptr<const TextNormalizer> precompiled(std::string charsmap,
                                                           const std::string& source);

  std::string normalize(std::string_view text) const;
  // "Precompiled, NFC, Replace(\s+ -> ' '), Lowercase", for logs and errors.
  std::string describe() const;

 private:
  enum class Kind {
    kPrecompiled,
    kNfc,
    kLowercase,
    kReplaceText,
    kReplaceSpaceRuns,
    kReplaceRepeatedSpaces,
    kStrip
  };
  struct Step {
    Kind kind;
    std::shared_ptr<const PrecompiledCharsmap> charsmap;
    std::string pattern;  // kReplaceText
    std::string content;  // kReplace*
    bool left = false;    // kStrip
    bool right = false;
  };
  void add(const nlohmann::json& spec, const std::string& source);

  std::vector<Step> steps_;
};

}  // namespace titan
