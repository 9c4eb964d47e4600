// Hugging Face text normalizers (see normalizer.h).
#include "titan/components/tokenizer/normalizer.h"

#include "titan/common/check.h"
#include "titan/components/tokenizer/tokenizer_files.h"
#include "titan/components/tokenizer/unicode.h"
#include "titan/components/tokenizer/unicode_norm.h"

#include <nlohmann/json.hpp>

#include <cstring>

namespace titan {
namespace {

// darts-clone's unit layout: label in bits 0-7 (bit 31 marks a leaf unit), has-leaf in bit 8,
// the offset to the children in bits 10-31 (shifted by 8 more when bit 9 is set).
uint32_t unit_label(uint32_t unit) { return unit & ((1u << 31) | 0xFF); }
bool unit_has_leaf(uint32_t unit) { return ((unit >> 8) & 1) == 1; }
uint32_t unit_value(uint32_t unit) { return unit & ((1u << 31) - 1); }
uint32_t unit_offset(uint32_t unit) { return (unit >> 10) << ((unit & (1u << 9)) >> 6); }

bool is_white_space(uint32_t cp) { return cp != kInvalidCodePoint && (char_class(cp) & kSpace); }

}  // namespace

void append_replaced(std::string_view text, std::string_view from, std::string_view to,
                     std::string* out) {
  size_t pos = 0;
  for (size_t hit; (hit = text.find(from, pos)) != std::string_view::npos;) {
    out->append(text.substr(pos, hit - pos));
    out->append(to);
    pos = hit + from.size();
  }
  out->append(text.substr(pos));
}

PrecompiledCharsmap::PrecompiledCharsmap(std::string blob, const std::string& source) {
  if (blob.size() < 4) {
    throw DataError(message(source, ": precompiled_charsmap of ", blob.size(),
                            " bytes is too short (a 4-byte trie size comes first)"));
  }
  uint32_t trie_bytes;
  std::memcpy(&trie_bytes, blob.data(), 4);  // little-endian, as on every machine we build for
  if (trie_bytes % 4 != 0 || trie_bytes > blob.size() - 4 || trie_bytes == 0) {
    throw DataError(message(source, ": precompiled_charsmap's trie size ", trie_bytes,
                            " does not fit its ", blob.size(), " bytes (at offset 0)"));
  }
  trie_.resize(trie_bytes / 4);
  std::memcpy(trie_.data(), blob.data() + 4, trie_bytes);
  pool_ = blob.substr(4 + trie_bytes);
  if (pool_.empty() || pool_.back() != '\0') pool_.push_back('\0');
}

bool PrecompiledCharsmap::transform(std::string_view chunk, std::string_view* replacement) const {
  size_t node = unit_offset(trie_[0]);
  for (char ch : chunk) {
    const uint32_t c = static_cast<unsigned char>(ch);
    if (c == 0) return false;
    node ^= c;
    if (node >= trie_.size()) return false;
    const uint32_t unit = trie_[node];
    if (unit_label(unit) != c) return false;
    node ^= unit_offset(unit);
    if (node >= trie_.size()) return false;
    if (unit_has_leaf(unit)) {
      const uint32_t index = unit_value(trie_[node]);
      if (index >= pool_.size()) return false;
      *replacement = std::string_view(pool_.data() + index);
      return true;
    }
  }
  return false;
}

void PrecompiledCharsmap::normalize(std::string_view text, std::string* out) const {
  size_t pos = 0;
  std::string_view replacement;
  while (pos < text.size()) {
    const size_t end = grapheme_end(text, pos);
    const std::string_view grapheme = text.substr(pos, end - pos);
    if (grapheme.size() < 6 && transform(grapheme, &replacement)) {
      out->append(replacement);
    } else {
      for (size_t i = 0; i < grapheme.size();) {
        size_t len;
        decode_utf8(grapheme, i, &len);
        const std::string_view ch = grapheme.substr(i, len);
        out->append(transform(ch, &replacement) ? replacement : ch);
        i += len;
      }
    }
    pos = end;
  }
}

std::shared_ptr<const TextNormalizer> TextNormalizer::from_json(const nlohmann::json& spec,
                                                                const std::string& source) {
  if (spec.is_null()) return nullptr;
  auto normalizer = std::make_shared<TextNormalizer>();
  normalizer->add(spec, source);
  return normalizer;
}

std::shared_ptr<const TextNormalizer> TextNormalizer::precompiled(std::string charsmap,
                                                                  const std::string& source) {
  auto normalizer = std::make_shared<TextNormalizer>();
  Step step{Kind::kPrecompiled};
  step.charsmap = std::make_shared<PrecompiledCharsmap>(std::move(charsmap), source);
  normalizer->steps_.push_back(std::move(step));
  return normalizer;
}

void TextNormalizer::add(const nlohmann::json& spec, const std::string& source) {
  const std::string type = spec.value("type", "");
  if (type == "Sequence") {
    for (const nlohmann::json& inner : spec.at("normalizers")) add(inner, source);
    return;
  }
  Step step{Kind::kNfc};
  if (type == "NFC") {
    step.kind = Kind::kNfc;
  } else if (type == "Lowercase") {
    step.kind = Kind::kLowercase;
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    step.left = spec.value("strip_left", false);
    step.right = spec.value("strip_right", false);
  } else if (type == "Precompiled") {
    step.kind = Kind::kPrecompiled;
    const nlohmann::json& map = spec.at("precompiled_charsmap");
    if (map.is_null()) return;  // a model without rules
    std::optional<std::string> blob = decode_base64(map.get<std::string>());
    if (!blob) throw DataError(message(source, ": precompiled_charsmap is not base64"));
    step.charsmap = std::make_shared<PrecompiledCharsmap>(std::move(*blob), source);
  } else if (type == "Replace") {
    const nlohmann::json& pattern = spec.at("pattern");
    step.content = spec.at("content").get<std::string>();
    if (pattern.contains("String")) {
      step.kind = Kind::kReplaceText;
      step.pattern = pattern.at("String").get<std::string>();
      if (step.pattern.empty()) {
        throw ConfigError(message(source, ": a Replace normalizer with an empty pattern"));
      }
    } else {
      const std::string regex = pattern.value("Regex", "");
      if (regex == "\\s+") {
        step.kind = Kind::kReplaceSpaceRuns;
      } else if (regex == " {2,}") {
        step.kind = Kind::kReplaceRepeatedSpaces;
      } else {
        throw ConfigError(message(source, ": unsupported Replace normalizer pattern ",
                                  pattern.dump(),
                                  "; supported: a String, or the Regex \\s+ or "
                                  "' {2,}' (CLIP's and T5's)"));
      }
    }
  } else {
    throw ConfigError(message(source, ": unsupported normalizer type '", type,
                              "'; supported: Precompiled, NFC, Lowercase, Replace, Strip, "
                              "Sequence"));
  }
  steps_.push_back(std::move(step));
}

std::string TextNormalizer::normalize(std::string_view text) const {
  std::string current(text);
  std::string next;
  for (const Step& step : steps_) {
    next.clear();
    switch (step.kind) {
      case Kind::kPrecompiled: step.charsmap->normalize(current, &next); break;
      case Kind::kNfc: append_nfc(current, &next); break;
      case Kind::kLowercase: append_lowercase(current, &next); break;
      case Kind::kReplaceText: append_replaced(current, step.pattern, step.content, &next); break;
      case Kind::kReplaceSpaceRuns:
      case Kind::kReplaceRepeatedSpaces: {
        const bool any_space = step.kind == Kind::kReplaceSpaceRuns;
        for (size_t pos = 0; pos < current.size();) {
          size_t len;
          size_t end = pos;
          size_t count = 0;
          while (end < current.size()) {
            const uint32_t cp = decode_utf8(current, end, &len);
            if (any_space ? !is_white_space(cp) : cp != ' ') break;
            end += len;
            ++count;
          }
          if (count >= (any_space ? 1u : 2u)) {
            next += step.content;
            pos = end;
          } else if (count == 1) {
            next.append(current, pos, end - pos);
            pos = end;
          } else {
            decode_utf8(current, pos, &len);
            next.append(current, pos, len);
            pos += len;
          }
        }
        break;
      }
      case Kind::kStrip: {
        size_t begin = 0;
        size_t end = current.size();
        size_t len;
        while (step.left && begin < end && is_white_space(decode_utf8(current, begin, &len))) {
          begin += len;
        }
        // Trailing white space: walk back to the start of each last code point.
        while (step.right && end > begin) {
          size_t start = end - 1;
          while (start > begin && (static_cast<unsigned char>(current[start]) & 0xC0) == 0x80 &&
                 end - start < 4) {
            --start;
          }
          const uint32_t cp = decode_utf8(current, start, &len);
          if (start + len != end || !is_white_space(cp)) break;
          end = start;
        }
        next.assign(current, begin, end - begin);
        break;
      }
    }
    current.swap(next);
  }
  return current;
}

std::string TextNormalizer::describe() const {
  std::string out;
  for (const Step& step : steps_) {
    if (!out.empty()) out += ", ";
    switch (step.kind) {
      case Kind::kPrecompiled: out += "Precompiled"; break;
      case Kind::kNfc: out += "NFC"; break;
      case Kind::kLowercase: out += "Lowercase"; break;
      case Kind::kReplaceText: out += "Replace"; break;
      case Kind::kReplaceSpaceRuns: out += "Replace(\\s+)"; break;
      case Kind::kReplaceRepeatedSpaces: out += "Replace(' {2,}')"; break;
      case Kind::kStrip: out += "Strip"; break;
    }
  }
  return out;
}

}  // namespace titan
