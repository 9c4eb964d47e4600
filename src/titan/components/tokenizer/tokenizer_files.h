// Readers for the tokenizer file formats behind BpeTokenizer:
//   - Hugging Face tokenizer.json (model.type "BPE", ByteLevel or Split(GPT-2 / Llama-3 regex)
//     pre-tokenizer, possibly inside a Sequence; added_tokens),
//   - GPT-2's vocab.json + merges.txt (also spelled encoder.json + vocab.bpe),
//   - tiktoken rank files (Llama 3's tokenizer.model: "base64-token rank" per line).
// Missing files or unsupported settings throw ConfigError; unreadable or corrupt files throw
// DataError; both name the file.
#pragma once

#include "titan/components/tokenizer/bpe.h"

#include <memory>
#include <string>

namespace titan {

BpeModel read_hf_tokenizer_json(const std::string& path);
BpeModel read_gpt2_vocab(const std::string& vocab_path, const std::string& merges_path);
// Llama 3 (exactly 128000 ranks) gets its 256 special tokens, <|begin_of_text|> = 128000.
BpeModel read_tiktoken(const std::string& path);

// `path` is a tokenizer.json, a tiktoken file, or a folder holding tokenizer.json, vocab.json +
// merges.txt, encoder.json + vocab.bpe, or tokenizer.model (also under original/), tried in
// that order.
std::unique_ptr<BpeTokenizer> load_bpe_tokenizer(const std::string& path);

}  // namespace titan
