// Byte-level BPE training (`titan tokenizer train`): count the GPT-2 pre-tokens of a corpus, start
// from the 256 byte tokens and repeatedly merge the most frequent adjacent pair until the
// vocabulary (special tokens included) is full. The result is written as a Hugging Face
// tokenizer.json that build_tokenizer() loads. Training is deterministic: ties between pairs of
// equal count go to the lexicographically smallest (left, right) pair of byte-level token strings.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace titan {

struct BpeTrainerOptions {
  // Total vocabulary: 256 bytes + merges + special tokens.
  int64_t vocab_size = 8192;
  // Appended after the learned tokens as added_tokens (first is BOS, second EOS).
  std::vector<std::string> special_tokens = {"<|begin_of_text|>", "<|end_of_text|>"};
};

struct BpeTrainResult {
  // Raw bytes of each ordinary token by id: ids 0..255 are the bytes, then one per merge.
  std::vector<std::string> tokens;
  // Merge rules in rank order as (left id, right id). Each usually adds the next id; a merge whose
  // result is already a token ("a"+"bc" after "ab"+"c") reuses that id, as Hugging Face does.
  std::vector<std::pair<int32_t, int32_t>> merges;
  // Special tokens and their ids (after the last ordinary token).
  std::vector<std::pair<std::string, int64_t>> special_tokens;
};

// Called after each merge with (merges done, merges wanted).
using BpeProgressFn = std::function<void(int64_t, int64_t)>;

class BpeTrainer {
 public:
  // Pre-tokenizes `text` with the GPT-2 splitter and adds its pieces to the word counts.
  void add_text(std::string_view text);
  // Learns the merges. Throws ConfigError when vocab_size leaves no room for the 256 bytes and
  // the special tokens. Stops early (smaller vocabulary) when no adjacent pair is left.
  BpeTrainResult train(const BpeTrainerOptions& options, const BpeProgressFn& progress = {}) const;

  size_t num_unique_words() const { return word_counts_.size(); }

 private:
  std::unordered_map<std::string, int64_t> word_counts_;
};

// The .txt files named by `inputs`: a file is taken as is, a folder contributes its *.txt files
// recursively; the result is sorted. Throws ConfigError for a missing input or no files.
std::vector<std::string> list_training_files(const std::vector<std::string>& inputs);

// The Hugging Face tokenizer.json text of `result` (ByteLevel pre-tokenizer and decoder).
std::string bpe_tokenizer_json(const BpeTrainResult& result);

// Writes `result` to dir/tokenizer.json atomically (temp file + rename), creating `dir`.
void write_bpe_tokenizer_json(const BpeTrainResult& result, const std::string& dir);

}  // namespace titan
