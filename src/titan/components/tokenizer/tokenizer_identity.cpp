// Tokenizer fit and identity checks; see tokenizer_identity.h.
#include "titan/components/tokenizer/tokenizer_identity.h"

#include "titan/common/check.h"
#include "titan/components/data/manifest.h"

#include <cstdio>
#include <cstring>

namespace titan {

namespace {

// Covers the paths a BPE takes: words with and without a leading space, contractions, digit
// runs, punctuation, whitespace runs and newlines, 2-, 3- and 4-byte UTF-8.
constexpr const char* kProbe =
    "The quick brown fox jumps over the lazy dog. It's 2024-06-01, 12:34:56; x = 3.14159 * r^2\n"
    "    indented\tcode { return a[i] + b[j]; }  // comment\n\n"
    "Caf\xC3\xA9 na\xC3\xAFve \xC3\xBC"
    "ber Stra\xC3\x9F"
    "e, \xD0\xBF\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 "
    "\xE4\xBD\xA0\xE5\xA5\xBD\xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x98\x80\xF0\x9F\x9A\x80 "
    "HTTPS://example.org/a_b?c=d&e=f  ...!!! \"quoted\" 'single' --flag=1 100000000";

}  // namespace

int64_t bos_id_or_none(const Tokenizer& tokenizer) {
  try {
    return tokenizer.bos_id();
  } catch (const ConfigError&) {
    return -1;
  }
}

int64_t eos_id_or_none(const Tokenizer& tokenizer) {
  try {
    return tokenizer.eos_id();
  } catch (const ConfigError&) {
    return -1;
  }
}

void check_tokenizer_fits_model(const Tokenizer& tokenizer, int64_t model_vocab_size,
                                const std::string& model, const std::string& hint) {
  if (tokenizer.vocab_size() > model_vocab_size) {
    throw ConfigError(message("tokenizer vocab ", tokenizer.vocab_size(),
                              " exceeds the model's vocab_size ", model_vocab_size, " for ", model,
                              "; ", hint));
  }
}

std::string tokenizer_fingerprint(const Tokenizer& tokenizer) {
  std::vector<int64_t> values = {tokenizer.vocab_size(), bos_id_or_none(tokenizer),
                                 eos_id_or_none(tokenizer)};
  const std::vector<int64_t> ids = tokenizer.encode(kProbe);
  values.insert(values.end(), ids.begin(), ids.end());
  std::string bytes(values.size() * sizeof(int64_t), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(fnv1a64(bytes)));
  return hex;
}

nlohmann::json tokenizer_record(const Tokenizer& tokenizer, const std::string& path) {
  return {{"path", path},
          {"vocab_size", tokenizer.vocab_size()},
          {"fingerprint", tokenizer_fingerprint(tokenizer)}};
}

std::string tokenizer_difference(const nlohmann::json& recorded, const nlohmann::json& current) {
  if (!recorded.is_object() || !recorded.contains("fingerprint")) return "";
  if (recorded.value("fingerprint", "") == current.value("fingerprint", "")) return "";
  const auto describe = [](const nlohmann::json& r) {
    const std::string path = r.value("path", "");
    return (path.empty() ? std::string("the byte tokenizer (model.hf_assets_path \"\")")
                         : "'" + path + "'") +
           " (vocab " + std::to_string(r.value("vocab_size", int64_t{-1})) + ", fingerprint " +
           r.value("fingerprint", "") + ")";
  };
  return "the checkpoint's data-loader position was recorded with tokenizer " + describe(recorded) +
         ", this run uses " + describe(current) +
         "; resuming continues the data stream at a position counted in the other tokenizer's "
         "ids. HINT: set model.hf_assets_path to the checkpoint's tokenizer, or add \"dataloader\" "
         "to checkpoint.exclude_from_loading to restart the data from the beginning";
}

}  // namespace titan
