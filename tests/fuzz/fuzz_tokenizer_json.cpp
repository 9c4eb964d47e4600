// Fuzzes Hugging Face tokenizer.json reading (read_hf_tokenizer_json: vocab, merges in both
// spellings, pre-tokenizer tree, added tokens) and the BpeTokenizer checks it feeds; a tokenizer
// that loads must encode and decode a short text.
#include "fuzz_util.h"

#include "titan/components/tokenizer/tokenizer_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan;
  fuzz::parse_input_file("tokenizer.json", data, size, [](const std::string& path) {
    BpeTokenizer tokenizer(read_hf_tokenizer_json(path));
    const std::vector<int64_t> ids = tokenizer.encode("Hello world <|endoftext|> 123 \xc3\xa9!");
    tokenizer.decode(ids);
  });
  return 0;
}
