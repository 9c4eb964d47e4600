// The unigram tokenizer (see unigram.h), following Hugging Face tokenizers' Unigram model and
// Metaspace pre-tokenizer.
#include "titan/components/tokenizer/unigram.h"

#include "titan/common/check.h"
#include "titan/components/tokenizer/unicode.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace titan {
namespace {

constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581, SentencePiece's space
constexpr double kUnknownPenalty = 10.0;                 // below the lowest piece score

bool is_white_space_at(std::string_view text, size_t pos, size_t* len) {
  const uint32_t cp = decode_utf8(text, pos, len);
  return cp != kInvalidCodePoint && (char_class(cp) & kSpace);
}

// Splits `text` at the added tokens of `tokens` (longest first at each position): calls
// on_text(segment, starts_at_text_start) for the text between them and on_token(token).
template <class OnText, class OnToken>
void split_added(std::string_view text, const std::vector<const AddedToken*>& tokens,
                 OnText&& on_text, OnToken&& on_token) {
  size_t start = 0;
  if (!tokens.empty()) {
    for (size_t pos = 0; pos < text.size(); ++pos) {
      for (const AddedToken* token : tokens) {
        if (text.compare(pos, token->content.size(), token->content) != 0) continue;
        if (pos > start) on_text(text.substr(start, pos - start), start == 0);
        on_token(*token);
        start = pos + token->content.size();
        pos = start - 1;
        break;
      }
    }
  }
  if (start < text.size()) on_text(text.substr(start), start == 0);
}

}  // namespace

UnigramTokenizer::UnigramTokenizer(UnigramModel model) : model_(std::move(model)) {
  const std::string& src = model_.source;
  if (model_.pieces.empty()) throw DataError(src + ": the unigram vocabulary is empty");
  vocab_size_ = static_cast<int64_t>(model_.pieces.size());
  for (const AddedToken& t : model_.added_tokens) {
    if (t.content.empty()) {
      throw DataError(message(src, ": the added token of id ", t.id, " is empty"));
    }
    if (t.id < 0 || t.id >= vocab_size_ + static_cast<int64_t>(model_.added_tokens.size())) {
      throw DataError(message(src, ": added token '", t.content, "' has an invalid id ", t.id,
                              " (the vocabulary has ", vocab_size_, " pieces)"));
    }
    if (t.id < vocab_size_ && model_.pieces[t.id].first != t.content) {
      throw DataError(message(src, ": added-token id collision: '", t.content, "' has id ", t.id,
                              ", which belongs to the piece '", model_.pieces[t.id].first, "'"));
    }
    vocab_size_ = std::max(vocab_size_, t.id + 1);
  }
  for (std::optional<int64_t> id : {model_.unk_id, model_.bos_id, model_.eos_id, model_.pad_id}) {
    if (id && (*id < 0 || *id >= vocab_size_)) {
      throw DataError(
          message(src, ": special id ", *id, " is outside the vocabulary of ", vocab_size_));
    }
  }
  double min_score = std::numeric_limits<double>::infinity();
  trie_.emplace_back();
  for (size_t id = 0; id < model_.pieces.size(); ++id) {
    const auto& [piece, score] = model_.pieces[id];
    if (!std::isfinite(score)) {
      throw DataError(message(src, ": piece ", id, " ('", piece, "') has a non-finite score"));
    }
    min_score = std::min(min_score, score);
    // A duplicated piece maps to its last id, as in Hugging Face's vocabulary map.
    piece_ids_[piece] = static_cast<int32_t>(id);
    if (piece.empty()) continue;
    int32_t node = 0;
    for (char ch : piece) {
      const unsigned char b = static_cast<unsigned char>(ch);
      int32_t next = child(node, b);
      if (next < 0) {
        next = static_cast<int32_t>(trie_.size());
        trie_.emplace_back();
        auto& kids = trie_[node].children;
        kids.insert(std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, int32_t{-1})),
                    {b, next});
      }
      node = next;
    }
    trie_[node].id = static_cast<int32_t>(id);
  }
  unk_score_ = min_score - kUnknownPenalty;
  is_special_.assign(vocab_size_, false);
  for (const AddedToken& t : model_.added_tokens) {
    if (t.special) is_special_[t.id] = true;
    (t.normalized ? normalized_added_ : raw_added_).push_back(&t);
  }
  const auto longest_first = [](const AddedToken* a, const AddedToken* b) {
    return a->content.size() > b->content.size();
  };
  std::stable_sort(raw_added_.begin(), raw_added_.end(), longest_first);
  std::stable_sort(normalized_added_.begin(), normalized_added_.end(), longest_first);
  byte_tokens_.fill(-1);
  if (model_.byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      auto it = piece_ids_.find(name);
      if (it != piece_ids_.end()) byte_tokens_[b] = it->second;
    }
  }
}

int32_t UnigramTokenizer::child(int32_t node, unsigned char byte) const {
  const auto& kids = trie_[node].children;
  auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(byte, int32_t{-1}));
  return (it != kids.end() && it->first == byte) ? it->second : -1;
}

int64_t UnigramTokenizer::bos_id() const {
  if (!model_.bos_id) {
    throw ConfigError(message(model_.source, ": the tokenizer defines no BOS token"));
  }
  return *model_.bos_id;
}

int64_t UnigramTokenizer::eos_id() const {
  if (!model_.eos_id) {
    throw ConfigError(message(model_.source, ": the tokenizer defines no EOS token (</s>)"));
  }
  return *model_.eos_id;
}

std::vector<int64_t> UnigramTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  split_added(
      text, raw_added_,
      [&](std::string_view segment, bool at_start) {
        const std::string normalized =
            model_.normalizer ? model_.normalizer->normalize(segment) : std::string(segment);
        split_added(
            normalized, normalized_added_,
            [&](std::string_view part, bool part_at_start) {
              encode_segment(part, at_start && part_at_start, &ids);
            },
            [&](const AddedToken& t) { ids.push_back(t.id); });
      },
      [&](const AddedToken& t) { ids.push_back(t.id); });
  return ids;
}

void UnigramTokenizer::encode_segment(std::string_view text, bool at_start,
                                      std::vector<int64_t>* ids) const {
  // Words: white-space separated (WhitespaceSplit), else the whole segment.
  std::vector<std::string_view> words;
  if (model_.whitespace_split) {
    size_t pos = 0;
    size_t len;
    while (pos < text.size()) {
      while (pos < text.size() && is_white_space_at(text, pos, &len)) pos += len;
      const size_t begin = pos;
      while (pos < text.size() && !is_white_space_at(text, pos, &len)) pos += len;
      if (pos > begin) words.push_back(text.substr(begin, pos - begin));
    }
  } else if (!text.empty()) {
    words.push_back(text);
  }
  std::string word;
  for (size_t w = 0; w < words.size(); ++w) {
    // Metaspace: spaces become '▁', one is prepended, then the word is cut before each '▁'.
    word.clear();
    for (char ch : words[w]) {
      if (ch == ' ') {
        word += kMetaspace;
      } else {
        word.push_back(ch);
      }
    }
    const bool starts_with_space = word.compare(0, kMetaspace.size(), kMetaspace) == 0;
    const bool first_word = at_start && words[w].data() == text.data();
    if (!starts_with_space && (model_.prepend == UnigramModel::Prepend::kAlways ||
                               (model_.prepend == UnigramModel::Prepend::kFirst && first_word))) {
      word.insert(0, kMetaspace);
    }
    if (!model_.split_on_replacement) {
      encode_word(word, ids);
      continue;
    }
    size_t begin = 0;
    for (size_t hit = word.find(kMetaspace, 1); hit != std::string::npos;
         hit = word.find(kMetaspace, hit + 1)) {
      if (hit > begin) encode_word(std::string_view(word).substr(begin, hit - begin), ids);
      begin = hit;
    }
    encode_word(std::string_view(word).substr(begin), ids);
  }
}

void UnigramTokenizer::encode_word(std::string_view word, std::vector<int64_t>* ids) const {
  if (word.empty()) return;
  // best[i]: the highest-scoring segmentation of word[0, i) ends with the piece word[from, i).
  struct Node {
    double score = 0.0;
    int64_t from = -1;
    int32_t id = -1;
  };
  std::vector<Node> best(word.size() + 1);
  best[0].from = 0;
  const int32_t unk = model_.unk_id ? static_cast<int32_t>(*model_.unk_id) : -1;
  size_t start = 0;
  while (start < word.size()) {
    size_t char_len;
    decode_utf8(word, start, &char_len);
    const double base = best[start].score;
    bool has_single = false;
    int32_t node = 0;
    for (size_t end = start; end < word.size();) {
      node = child(node, static_cast<unsigned char>(word[end]));
      if (node < 0) break;
      ++end;
      const int32_t id = trie_[node].id;
      if (id < 0) continue;
      const double score = base + model_.pieces[id].second;
      Node& target = best[end];
      if (target.from < 0 || score > target.score)
        target = Node{score, static_cast<int64_t>(start), id};
      if (end - start == char_len) has_single = true;
    }
    if (!has_single) {
      Node& target = best[start + char_len];
      const double score = base + unk_score_;
      if (target.from < 0 || score > target.score) {
        target = Node{score, static_cast<int64_t>(start), unk};
      }
    }
    start += char_len;
  }
  // Back from the end; consecutive unknown pieces are fused into one.
  std::vector<std::pair<size_t, size_t>> spans;  // [from, to) of each piece, last first
  std::vector<bool> unknown;
  for (size_t end = word.size(); end > 0;) {
    const Node& node = best[end];
    const size_t from = static_cast<size_t>(node.from);
    const bool is_unk = node.id == unk;
    if (is_unk && !unknown.empty() && unknown.back()) {
      spans.back().first = from;
    } else {
      spans.emplace_back(from, end);
      unknown.push_back(is_unk);
    }
    end = from;
  }
  for (size_t k = spans.size(); k-- > 0;) {
    const std::string_view piece = word.substr(spans[k].first, spans[k].second - spans[k].first);
    auto it = piece_ids_.find(std::string(piece));
    if (it != piece_ids_.end()) {
      ids->push_back(it->second);
    } else {
      add_unknown(piece, ids);
    }
  }
}

void UnigramTokenizer::add_unknown(std::string_view text, std::vector<int64_t>* ids) const {
  if (model_.byte_fallback) {
    bool all = true;
    for (char ch : text) all = all && byte_tokens_[static_cast<unsigned char>(ch)] >= 0;
    if (all) {
      for (char ch : text) ids->push_back(byte_tokens_[static_cast<unsigned char>(ch)]);
      return;
    }
  }
  if (!model_.unk_id) {
    throw DataError(message(model_.source, ": no piece covers '", text,
                            "' and the unigram model has no unknown token"));
  }
  ids->push_back(*model_.unk_id);
}

std::string UnigramTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string text;
  for (int64_t id : ids) {
    TITAN_CHECK(id >= 0 && id < vocab_size_, "UnigramTokenizer: token id ", id,
                " is not in the vocabulary of ", model_.source, " (size ", vocab_size_, ")");
    if (is_special_[id]) continue;
    if (id >= static_cast<int64_t>(model_.pieces.size())) {
      for (const AddedToken& t : model_.added_tokens) {
        if (t.id == id) text += t.content;
      }
      continue;
    }
    const std::string& piece = model_.pieces[id].first;
    unsigned byte;
    if (model_.byte_fallback && piece.size() == 6 &&
        std::sscanf(piece.c_str(), "<0x%02X>", &byte) == 1) {
      text.push_back(static_cast<char>(byte));
      continue;
    }
    text += piece;
  }
  std::string out;
  append_replaced(text, kMetaspace, " ", &out);
  if (model_.prepend != UnigramModel::Prepend::kNever && !out.empty() && out[0] == ' ') {
    out.erase(0, 1);
  }
  return out;
}

}  // namespace titan
