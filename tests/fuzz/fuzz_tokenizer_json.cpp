// Fuzzes Hugging Face tokenizer.json reading (read_tokenizer_json: BPE vocab and merges in both
// spellings, unigram vocabularies, normalizer and pre-tokenizer trees, added tokens) and the
// BpeTokenizer / UnigramTokenizer checks it feeds; a tokenizer that loads must encode and decode
// a short text.
#include "fuzz_util.h"

#include "titan/components/tokenizer/tokenizer_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan;
  fuzz::parse_input_file("tokenizer.json", data, size, [](const std::string& path) {
    const std::unique_ptr<Tokenizer> tokenizer = read_tokenizer_json(path);
    const std::vector<int64_t> ids =
        tokenizer->encode("Hello  World <|endoftext|> 123 e\xcc\x81\xc3\xa9 \xef\xbc\xa1!");
    tokenizer->decode(ids);
  });
  return 0;
}
