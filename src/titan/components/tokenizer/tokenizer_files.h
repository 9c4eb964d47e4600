// Readers for the tokenizer file formats behind BpeTokenizer and UnigramTokenizer:
//   - Hugging Face tokenizer.json (model.type "BPE", ByteLevel or Split(GPT-2 / Llama-3 regex)
//     pre-tokenizer, possibly inside a Sequence; added_tokens),
//   - GPT-2's vocab.json + merges.txt (also spelled encoder.json + vocab.bpe),
//   - tiktoken rank files (Llama 3's tokenizer.model: "base64-token rank" per line),
//   - CLIP's files (a tokenizer.json with CLIP's normalizers, regex and "</w>" suffix, or
//     vocab.json + merges.txt holding <|startoftext|> and "</w>" tokens),
//   - unigram models (T5's): a tokenizer.json with model.type "Unigram", or SentencePiece's
//     spiece.model read as transformers' T5Tokenizer converts it.
// Missing files or unsupported settings throw ConfigError; unreadable or corrupt files throw
// DataError; both name the file.
#pragma once

#include "titan/components/tokenizer/bpe.h"
#include "titan/components/tokenizer/unigram.h"

#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace titan {

BpeModel read_hf_tokenizer_json(const std::string& path);
// A tokenizer.json of either model type.
std::unique_ptr<Tokenizer> read_tokenizer_json(const std::string& path);
// SentencePiece's ModelProto (unigram only) with `extra_ids` sentinels <extra_id_N> appended,
// ids counting down (T5's layout). Corrupt files throw DataError with the byte offset.
UnigramModel read_sentencepiece_model(const std::string& path, int64_t extra_ids);
BpeModel read_gpt2_vocab(const std::string& vocab_path, const std::string& merges_path);
// Llama 3 (exactly 128000 ranks) gets its 256 special tokens, <|begin_of_text|> = 128000.
BpeModel read_tiktoken(const std::string& path);

// `path` is a tokenizer.json, a SentencePiece or tiktoken file, or a folder holding
// tokenizer.json, spiece.model (+ tokenizer_config.json's extra_ids), vocab.json + merges.txt,
// encoder.json + vocab.bpe, or tokenizer.model (also under original/), tried in that order.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// Standard base64 (optional '=' padding); nullopt on any other character.
std::optional<std::string> decode_base64(std::string_view text);

}  // namespace titan
