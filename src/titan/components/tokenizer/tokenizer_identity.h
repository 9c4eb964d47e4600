// What ties a tokenizer to a model and to a checkpoint. The vocabulary must fit the model's
// embedding (an id past it indexes out of range), and the data-loader state in a checkpoint is a
// position in a stream of token ids, so it belongs to the tokenizer that produced them.
#pragma once

#include "titan/components/tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace titan {

// Throws ConfigError "tokenizer vocab N exceeds the model's vocab_size M for <model>; <hint>"
// when `tokenizer` has more ids than the model's embedding rows (`model_vocab_size`).
void check_tokenizer_fits_model(const Tokenizer& tokenizer, int64_t model_vocab_size,
                                const std::string& model, const std::string& hint);

// tokenizer.bos_id() / eos_id(), or -1 when the tokenizer defines none (BPE files may lack them).
int64_t bos_id_or_none(const Tokenizer& tokenizer);
int64_t eos_id_or_none(const Tokenizer& tokenizer);

// A hash of what the tokenizer does: its vocabulary size, BOS/EOS ids and the ids of a fixed
// probe text (ASCII words, digits, whitespace runs, accents, CJK, emoji), as 16 hex digits. The
// same tokenizer gives the same fingerprint from any path; a different one almost surely not.
std::string tokenizer_fingerprint(const Tokenizer& tokenizer);

// What a checkpoint records: {"path": <model.hf_assets_path>, "vocab_size": N,
// "fingerprint": <tokenizer_fingerprint>}.
nlohmann::json tokenizer_record(const Tokenizer& tokenizer, const std::string& path);

// "" when `recorded` and `current` (tokenizer_record values) have the same fingerprint, or when
// `recorded` is not a record (a checkpoint from before they were kept); otherwise a sentence
// naming both tokenizers by path, vocabulary size and fingerprint.
std::string tokenizer_difference(const nlohmann::json& recorded, const nlohmann::json& current);

}  // namespace titan
