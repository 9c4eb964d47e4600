// Byte-level BPE training with incremental pair counts. Each unique pre-token ("word") is a list of
// token ids with a frequency. We keep, per adjacent pair, its total count and the words that may
// contain it (a superset: entries go stale as words change and are re-checked when used), plus a
// max-heap of (count, pair) with lazy invalidation: a popped entry whose count is out of date is
// pushed back with the current count. Existing pairs only ever lose count (every new pair holds
// the new token), so a stale entry is always an upper bound and the first valid pop is the best.
#include "titan/components/tokenizer/bpe_trainer.h"

#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/components/tokenizer/pre_tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <filesystem>
#include <queue>

namespace titan {
namespace {

namespace fs = std::filesystem;

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}
int32_t key_left(uint64_t key) { return static_cast<int32_t>(key >> 32); }
int32_t key_right(uint64_t key) { return static_cast<int32_t>(key & 0xFFFFFFFFu); }

// GPT-2's bytes_to_unicode as UTF-8: printable Latin-1 bytes stand for themselves, the other 68
// bytes take the code points 256, 257, ... in byte order (Hugging Face ByteLevel).
const std::array<std::string, 256>& byte_to_unicode() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const int cp = printable ? b : next++;
      if (cp < 0x80) {
        t[b] = std::string(1, static_cast<char>(cp));
      } else {
        t[b] = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
      }
    }
    return t;
  }();
  return table;
}

std::string to_byte_level(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) out += byte_to_unicode()[b];
  return out;
}

struct HeapEntry {
  int64_t count;
  uint64_t key;
};

// State of one training run.
class Merger {
 public:
  explicit Merger(const std::unordered_map<std::string, int64_t>& word_counts) {
    std::vector<std::pair<std::string, int64_t>> sorted(word_counts.begin(), word_counts.end());
    std::sort(sorted.begin(), sorted.end());
    for (int b = 0; b < 256; ++b) {
      tokens_.emplace_back(1, static_cast<char>(b));
      spelled_.push_back(byte_to_unicode()[b]);
      token_ids_.emplace(tokens_.back(), b);
    }
    for (const auto& [word, count] : sorted) {
      std::vector<int32_t> ids(word.begin(), word.end());
      for (int32_t& id : ids) id = static_cast<unsigned char>(id);
      const int32_t w = static_cast<int32_t>(words_.size());
      for (size_t i = 0; i + 1 < ids.size(); ++i) {
        const uint64_t key = pair_key(ids[i], ids[i + 1]);
        pair_counts_[key] += count;
        pair_words_[key].push_back(w);
      }
      words_.push_back(std::move(ids));
      freqs_.push_back(count);
    }
    for (const auto& [key, count] : pair_counts_) heap_.push({count, key});
  }

  // Merges the best pair; false when no pair is left.
  bool merge_best() {
    while (!heap_.empty()) {
      const HeapEntry top = heap_.top();
      heap_.pop();
      auto it = pair_counts_.find(top.key);
      const int64_t current = it == pair_counts_.end() ? 0 : it->second;
      if (current == top.count) {
        apply_merge(top.key);
        return true;
      }
      if (current > 0) heap_.push({current, top.key});
    }
    return false;
  }

  size_t num_tokens() const { return tokens_.size(); }

  BpeTrainResult result() && {
    BpeTrainResult r;
    r.tokens = std::move(tokens_);
    r.merges = std::move(merges_);
    return r;
  }

 private:
  // Max-heap order: higher count first, then the smallest (left, right) byte-level strings.
  struct Less {
    const std::vector<std::string>* spelled;
    bool operator()(const HeapEntry& a, const HeapEntry& b) const {
      if (a.count != b.count) return a.count < b.count;
      const std::string& al = (*spelled)[key_left(a.key)];
      const std::string& bl = (*spelled)[key_left(b.key)];
      if (al != bl) return al > bl;
      return (*spelled)[key_right(a.key)] > (*spelled)[key_right(b.key)];
    }
  };

  void apply_merge(uint64_t key) {
    const int32_t left = key_left(key);
    const int32_t right = key_right(key);
    std::string merged = tokens_[left] + tokens_[right];
    // Two different pairs can spell the same token ("a"+"bc", "ab"+"c"): reuse its id.
    int32_t new_id;
    auto found = token_ids_.find(merged);
    if (found != token_ids_.end()) {
      new_id = found->second;
    } else {
      new_id = static_cast<int32_t>(tokens_.size());
      spelled_.push_back(spelled_[left] + spelled_[right]);
      token_ids_.emplace(merged, new_id);
      tokens_.push_back(std::move(merged));
    }
    merges_.emplace_back(left, right);

    std::vector<int32_t> candidates = std::move(pair_words_[key]);
    pair_words_.erase(key);
    std::sort(candidates.begin(), candidates.end());
    candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());

    std::unordered_map<uint64_t, int64_t> delta;
    std::vector<int32_t> merged_ids;
    for (int32_t w : candidates) {
      const std::vector<int32_t>& ids = words_[w];
      merged_ids.clear();
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i + 1 < ids.size() && ids[i] == left && ids[i + 1] == right) {
          merged_ids.push_back(new_id);
          ++i;
        } else {
          merged_ids.push_back(ids[i]);
        }
      }
      if (merged_ids.size() == ids.size()) continue;  // stale entry: the pair is gone
      const int64_t f = freqs_[w];
      for (size_t i = 0; i + 1 < ids.size(); ++i) delta[pair_key(ids[i], ids[i + 1])] -= f;
      for (size_t i = 0; i + 1 < merged_ids.size(); ++i) {
        const uint64_t k = pair_key(merged_ids[i], merged_ids[i + 1]);
        delta[k] += f;
        if (merged_ids[i] == new_id || merged_ids[i + 1] == new_id) pair_words_[k].push_back(w);
      }
      words_[w] = merged_ids;
    }
    for (const auto& [k, d] : delta) {
      if (d == 0) continue;
      int64_t& count = pair_counts_[k];
      count += d;
      if (count <= 0) {
        pair_counts_.erase(k);
      } else if (d > 0) {
        heap_.push({count, k});  // a pair holding the new token
      }
    }
  }

  std::vector<std::string> tokens_;
  std::vector<std::string> spelled_;
  std::unordered_map<std::string, int32_t> token_ids_;
  std::vector<std::pair<int32_t, int32_t>> merges_;
  std::vector<std::vector<int32_t>> words_;
  std::vector<int64_t> freqs_;
  std::unordered_map<uint64_t, int64_t> pair_counts_;
  std::unordered_map<uint64_t, std::vector<int32_t>> pair_words_;
  std::priority_queue<HeapEntry, std::vector<HeapEntry>, Less> heap_{Less{&spelled_}};
};

}  // namespace

void BpeTrainer::add_text(std::string_view text) {
  std::vector<std::string_view> pieces;
  pre_tokenize(PreTokenizer::kGpt2, text, &pieces);
  for (std::string_view piece : pieces) ++word_counts_[std::string(piece)];
}

BpeTrainResult BpeTrainer::train(const BpeTrainerOptions& options,
                                 const BpeProgressFn& progress) const {
  const int64_t num_special = static_cast<int64_t>(options.special_tokens.size());
  if (options.vocab_size < 256 + num_special) {
    throw ConfigError(message("tokenizer train: --vocab-size ", options.vocab_size,
                              " is too small; it must hold the 256 byte tokens and ", num_special,
                              " special tokens (at least ", 256 + num_special, ")"));
  }
  const int64_t wanted = options.vocab_size - num_special - 256;
  Merger merger(word_counts_);
  while (static_cast<int64_t>(merger.num_tokens()) < options.vocab_size - num_special) {
    if (!merger.merge_best()) break;
    if (progress) progress(static_cast<int64_t>(merger.num_tokens()) - 256, wanted);
  }
  BpeTrainResult result = std::move(merger).result();
  for (const std::string& special : options.special_tokens) {
    const int64_t id = static_cast<int64_t>(result.tokens.size() + result.special_tokens.size());
    result.special_tokens.emplace_back(special, id);
  }
  return result;
}

std::vector<std::string> list_training_files(const std::vector<std::string>& inputs) {
  if (inputs.empty()) throw ConfigError("tokenizer train: --input is required");
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    std::error_code ec;
    if (fs::is_directory(input, ec)) {
      for (const auto& entry : fs::recursive_directory_iterator(input)) {
        if (entry.is_regular_file() && entry.path().extension() == ".txt") {
          files.push_back(entry.path().string());
        }
      }
    } else if (fs::is_regular_file(input, ec)) {
      files.push_back(input);
    } else if (fs::exists(input, ec)) {  // a FIFO would hang, a device fill memory
      throw ConfigError(message("tokenizer train: --input ", input, " is ",
                                non_regular_file_kind(input), ", not a regular file or folder"));
    } else {
      throw ConfigError(message("tokenizer train: --input ", input, ": no such file or folder"));
    }
  }
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  if (files.empty()) throw ConfigError("tokenizer train: no .txt files in the --input folders");
  return files;
}

std::string bpe_tokenizer_json(const BpeTrainResult& result) {
  using nlohmann::ordered_json;
  ordered_json added = ordered_json::array();
  for (const auto& [content, id] : result.special_tokens) {
    added.push_back({{"id", id},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  ordered_json vocab = ordered_json::object();
  for (size_t id = 0; id < result.tokens.size(); ++id) {
    vocab[to_byte_level(result.tokens[id])] = id;
  }
  ordered_json merges = ordered_json::array();
  for (const auto& [left, right] : result.merges) {
    merges.push_back(to_byte_level(result.tokens[left]) + " " +
                     to_byte_level(result.tokens[right]));
  }
  const auto byte_level = [](bool add_prefix_space) {
    return ordered_json{{"type", "ByteLevel"},
                        {"add_prefix_space", add_prefix_space},
                        {"trim_offsets", true},
                        {"use_regex", true}};
  };
  ordered_json root;
  root["version"] = "1.0";
  root["added_tokens"] = std::move(added);
  root["normalizer"] = nullptr;
  root["pre_tokenizer"] = byte_level(false);
  root["post_processor"] = nullptr;
  root["decoder"] = byte_level(true);
  root["model"] = {{"type", "BPE"},
                   {"dropout", nullptr},
                   {"unk_token", nullptr},
                   {"continuing_subword_prefix", nullptr},
                   {"end_of_word_suffix", nullptr},
                   {"fuse_unk", false},
                   {"byte_fallback", false},
                   {"vocab", std::move(vocab)},
                   {"merges", std::move(merges)}};
  return root.dump(2) + "\n";
}

void write_bpe_tokenizer_json(const BpeTrainResult& result, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw DataError(dir + ": cannot create the output folder (" + ec.message() + ")");
  // Checked write, sync and close through a temporary: a full disk is an error with the errno,
  // and an existing tokenizer.json is replaced whole or not at all.
  replace_file((fs::path(dir) / "tokenizer.json").string(), bpe_tokenizer_json(result));
}

}  // namespace titan
