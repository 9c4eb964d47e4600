// Byte-level BPE encoding and decoding. Merging follows the reference implementations: repeatedly
// merge the adjacent pair with the lowest rank, leftmost first, until no pair has a rank.
#include "titan/components/tokenizer/bpe.h"

#include "titan/common/check.h"

#include <algorithm>
#include <atomic>
#include <climits>

namespace titan {
namespace {

constexpr size_t kMaxCacheEntries = size_t{1} << 18;
constexpr int32_t kNoRank = INT32_MAX;

std::atomic<uint64_t> next_cache_owner{1};

// Piece -> ids cache: most words repeat, so most pieces skip merging entirely. One per thread,
// for the tokenizer that thread used last: no locks, and threads encoding in parallel never
// share cache lines (a cache shared under locks made two threads no faster than one).
struct PieceCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>> pieces;
};

PieceCache& piece_cache(uint64_t owner) {
  thread_local PieceCache cache;
  if (cache.owner != owner) {
    cache.pieces.clear();
    cache.owner = owner;
  }
  return cache;
}

}  // namespace

BpeTokenizer::BpeTokenizer(BpeModel model)
    : model_(std::move(model)), cache_owner_(next_cache_owner++) {
  const std::string& src = model_.source;
  int64_t size = static_cast<int64_t>(model_.tokens.size());
  const int64_t max_id =
      size + static_cast<int64_t>(model_.special_tokens.size()) + BpeModel::kMaxUnusedIds;
  for (const auto& [text, id] : model_.special_tokens) {
    if (text.empty()) {
      throw DataError(src + ": the special token of id " + std::to_string(id) +
                      " is empty (\"content\": \"\"); a special token needs text to match");
    }
    if (id < 0 || id >= max_id) {
      throw DataError(src + ": special token '" + text + "' has an invalid id " +
                      std::to_string(id) + " (want 0 <= id < " + std::to_string(max_id) +
                      ": the vocabulary's size plus at most " +
                      std::to_string(BpeModel::kMaxUnusedIds) + " unused ids)");
    }
    size = std::max(size, id + 1);
  }
  id_to_bytes_.assign(size, std::string());
  id_known_.assign(size, false);
  for (size_t id = 0; id < model_.tokens.size(); ++id) {
    const std::string& bytes = model_.tokens[id];
    if (bytes.empty()) continue;
    id_to_bytes_[id] = bytes;
    id_known_[id] = true;
    if (!token_to_id_.emplace(bytes, static_cast<int32_t>(id)).second) {
      throw DataError(src + ": two token ids (" + std::to_string(token_to_id_[bytes]) + " and " +
                      std::to_string(id) + ") have the same bytes; the vocabulary is corrupt");
    }
  }
  std::vector<bool> is_special(size, false);
  for (const auto& [text, id] : model_.special_tokens) {
    // An added token may repeat a vocabulary entry (same id, same text); another text at a taken
    // id would silently change what that id decodes to and break the merges that build it.
    if (id_known_[id] && id_to_bytes_[id] != text) {
      throw DataError(src + ": added-token id collision: special token '" + text + "' has id " +
                      std::to_string(id) + ", which already belongs to " +
                      (is_special[id] ? "special token '" : "vocabulary token '") +
                      id_to_bytes_[id] + "'; every id must name one token");
    }
    is_special[id] = true;
    id_to_bytes_[id] = text;
    id_known_[id] = true;
    if (model_.match_special_tokens) {
      specials_by_byte_[static_cast<unsigned char>(text[0])].emplace_back(text, id);
    }
  }
  for (auto& group : specials_by_byte_) {
    std::stable_sort(group.begin(), group.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  }
  for (int b = 0; b < 256; ++b) {
    auto it = token_to_id_.find(std::string(1, static_cast<char>(b)));
    if (it == token_to_id_.end()) {
      throw DataError(src + ": the vocabulary has no token for byte " + std::to_string(b) +
                      "; a byte-level BPE vocabulary must cover all 256 bytes");
    }
    byte_ids_[b] = it->second;
    suffixed_byte_ids_[b] = it->second;
    if (model_.end_of_word_suffix.empty()) continue;
    it = token_to_id_.find(std::string(1, static_cast<char>(b)) + model_.end_of_word_suffix);
    if (it == token_to_id_.end()) {
      throw DataError(src + ": the vocabulary has no token for byte " + std::to_string(b) +
                      " ending a word ('" + model_.end_of_word_suffix +
                      "' appended); the end_of_word_suffix needs all 256");
    }
    suffixed_byte_ids_[b] = it->second;
  }
  build_merges();
}

void BpeTokenizer::build_merges() {
  if (model_.merges_from_ranks) {
    // Every split of a token into two tokens is a merge with the token's rank (= id).
    for (const auto& [bytes, id] : token_to_id_) {
      for (size_t k = 1; k < bytes.size(); ++k) {
        auto left = token_to_id_.find(bytes.substr(0, k));
        if (left == token_to_id_.end()) continue;
        auto right = token_to_id_.find(bytes.substr(k));
        if (right == token_to_id_.end()) continue;
        merges_.emplace(pair_key(left->second, right->second), Merge{id, id});
      }
    }
    return;
  }
  merges_.reserve(model_.merges.size());
  for (size_t rank = 0; rank < model_.merges.size(); ++rank) {
    const auto [left, right] = model_.merges[rank];
    const std::string merged = token_bytes(left) + token_bytes(right);
    auto it = token_to_id_.find(merged);
    if (it == token_to_id_.end()) {
      throw DataError(model_.source + ": merge rule " + std::to_string(rank) +
                      " produces a token that is not in the vocabulary");
    }
    // A repeated rule keeps its first (lowest) rank.
    merges_.emplace(pair_key(left, right), Merge{static_cast<int32_t>(rank), it->second});
  }
}

const std::string& BpeTokenizer::token_bytes(int64_t id) const {
  TITAN_CHECK(id >= 0 && id < vocab_size() && id_known_[id], "BpeTokenizer: token id ", id,
              " is not in the vocabulary of ", model_.source, " (size ", vocab_size(), ")");
  return id_to_bytes_[id];
}

int64_t BpeTokenizer::bos_id() const {
  if (!model_.bos_id) {
    throw ConfigError(
        message(model_.source,
                ": the tokenizer defines no BOS token (looked for <|begin_of_text|> and "
                "<|endoftext|>); use tokenizer files that have one"));
  }
  return *model_.bos_id;
}

int64_t BpeTokenizer::eos_id() const {
  if (!model_.eos_id) {
    throw ConfigError(
        message(model_.source,
                ": the tokenizer defines no EOS token (looked for <|end_of_text|> and "
                "<|endoftext|>); use tokenizer files that have one"));
  }
  return *model_.eos_id;
}

std::vector<int64_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 3 + 1);
  if (!model_.match_special_tokens) {
    encode_ordinary(text, &ids);
    return ids;
  }
  size_t start = 0;
  for (size_t pos = 0; pos < text.size(); ++pos) {
    for (const auto& [special, id] : specials_by_byte_[static_cast<unsigned char>(text[pos])]) {
      if (text.compare(pos, special.size(), special) != 0) continue;
      encode_ordinary(text.substr(start, pos - start), &ids);
      ids.push_back(id);
      start = pos + special.size();
      pos = start - 1;
      break;
    }
  }
  encode_ordinary(text.substr(start), &ids);
  return ids;
}

void BpeTokenizer::encode_ordinary(std::string_view text, std::vector<int64_t>* ids) const {
  if (text.empty()) return;
  std::string normalized;
  if (model_.normalizer) {
    normalized = model_.normalizer->normalize(text);
    text = normalized;
  }
  std::string prefixed;
  if (model_.add_prefix_space && text[0] != ' ') {
    prefixed = " ";
    prefixed += text;
    text = prefixed;
  }
  std::vector<std::string_view> pieces;
  pre_tokenize(model_.pre_tokenizer, text, &pieces);
  for (std::string_view piece : pieces) encode_piece(piece, ids);
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int64_t>* ids) const {
  if (piece.size() == 1) {
    ids->push_back(suffixed_byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  const std::string key(piece);
  PieceCache& cache = piece_cache(cache_owner_);
  auto it = cache.pieces.find(key);
  if (it != cache.pieces.end()) {
    ids->insert(ids->end(), it->second.begin(), it->second.end());
    return;
  }
  std::vector<int32_t> parts;
  auto whole = model_.ignore_merges ? token_to_id_.find(key + model_.end_of_word_suffix)
                                    : token_to_id_.end();
  if (whole != token_to_id_.end()) {
    parts.push_back(whole->second);
  } else {
    merge_piece(piece, &parts);
  }
  ids->insert(ids->end(), parts.begin(), parts.end());
  if (cache.pieces.size() >= kMaxCacheEntries) cache.pieces.clear();
  cache.pieces.emplace(key, std::move(parts));
}

void BpeTokenizer::merge_piece(std::string_view piece, std::vector<int32_t>* parts) const {
  parts->resize(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) {
    (*parts)[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
  }
  parts->back() = suffixed_byte_ids_[static_cast<unsigned char>(piece.back())];
  // merges[i] is the merge of parts i and i+1, if any.
  const auto lookup = [&](size_t i) {
    auto it = merges_.find(pair_key((*parts)[i], (*parts)[i + 1]));
    return it == merges_.end() ? Merge{kNoRank, -1} : it->second;
  };
  std::vector<Merge> merges(piece.size() - 1);
  for (size_t i = 0; i + 1 < parts->size(); ++i) merges[i] = lookup(i);
  while (!merges.empty()) {
    size_t best = 0;
    for (size_t i = 1; i < merges.size(); ++i) {
      if (merges[i].rank < merges[best].rank) best = i;
    }
    if (merges[best].rank == kNoRank) break;
    (*parts)[best] = merges[best].id;
    parts->erase(parts->begin() + best + 1);
    merges.erase(merges.begin() + best);
    if (best < merges.size()) merges[best] = lookup(best);
    if (best > 0) merges[best - 1] = lookup(best - 1);
  }
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string text;
  for (int64_t id : ids) {
    if ((model_.bos_id && id == *model_.bos_id) || (model_.eos_id && id == *model_.eos_id)) {
      continue;
    }
    text += token_bytes(id);
  }
  const std::string& suffix = model_.end_of_word_suffix;
  if (suffix.empty()) return text;
  // Words end where the suffix stands (CLIP): a space there, none after the last word.
  std::string out;
  append_replaced(text, suffix, " ", &out);
  if (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

}  // namespace titan
