// The byte-level tokenizer and the factory that chooses a tokenizer from the model config
// (BPE files are read by tokenizer_files.cpp).
#include "titan/components/tokenizer/tokenizer.h"

#include "titan/common/check.h"
#include "titan/components/tokenizer/tokenizer_files.h"

namespace titan {

std::vector<int64_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    ids[i] = static_cast<unsigned char>(text[i]);
  }
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int64_t id : ids) {
    if (id == kBosId || id == kEosId) {
      continue;
    }
    TITAN_CHECK(id >= 0 && id < kNumBytes, "ByteTokenizer::decode: token id ", id,
                " is outside the vocabulary [0, ", kVocabSize, ")");
    text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
  }
  return text;
}

std::unique_ptr<Tokenizer> build_tokenizer(const std::string& hf_assets_path) {
  if (hf_assets_path.empty()) return std::make_unique<ByteTokenizer>();
  return load_tokenizer(hf_assets_path);
}

}  // namespace titan
