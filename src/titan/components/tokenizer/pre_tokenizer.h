// Pre-tokenizers split text into the pieces that BPE encodes one by one. Each is a hand-written
// scanner equivalent to one regex (leftmost alternative first, backtracking included), so no regex
// engine is needed and \p{L}, \p{N}, \s follow the generated Unicode tables:
//   kGpt2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   kLlama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   kClip:   <\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|
//            [^\s\p{L}\p{N}]+   with the matches kept and the rest (white space) removed, as
//            CLIP's Split(behavior Removed, invert) does: its pieces skip the white space.
//   kClipThenGpt2: kClip, then each piece split by kGpt2 (CLIP's Split followed by a ByteLevel
//            pre-tokenizer with use_regex: only the <|...|> pieces change, e.g. <| endoftext |>).
// Bytes that are not valid UTF-8 are units of their own outside every class, so the pieces
// always cover the input exactly.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

namespace titan {

enum class PreTokenizer { kGpt2, kLlama3, kClip, kClipThenGpt2 };

// The regex a pre-tokenizer implements, spelled as in tokenizer.json / tiktoken.
std::string_view pre_tokenizer_pattern(PreTokenizer kind);

// The pre-tokenizer whose regex is `pattern`, or nullopt for a regex we do not implement.
std::optional<PreTokenizer> pre_tokenizer_from_pattern(std::string_view pattern);

// Appends the pieces of `text` (views into it, in order, concatenating to `text` except for
// kClip's removed white space) to *pieces.
void pre_tokenize(PreTokenizer kind, std::string_view text, std::vector<std::string_view>* pieces);

}  // namespace titan
