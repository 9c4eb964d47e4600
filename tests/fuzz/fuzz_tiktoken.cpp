// Fuzzes tiktoken rank files ("<base64 token> <rank>" per line, Llama 3's tokenizer.model) through
// read_tiktoken and the BpeTokenizer checks; a tokenizer that loads must encode and decode.
#include "fuzz_util.h"

#include "titan/components/tokenizer/tokenizer_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan;
  fuzz::parse_input_file("tokenizer.model", data, size, [](const std::string& path) {
    BpeTokenizer tokenizer(read_tiktoken(path));
    tokenizer.decode(tokenizer.encode("Hello world 123 \xc3\xa9!"));
  });
  return 0;
}
