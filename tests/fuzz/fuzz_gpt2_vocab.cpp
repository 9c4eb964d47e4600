// Fuzzes GPT-2's vocab.json + merges.txt reading (read_gpt2_vocab) and the BpeTokenizer checks;
// a tokenizer that loads must encode and decode a short text.
//
// Input: vocab.json, a line "--8<--", then merges.txt (no separator: empty merges).
#include "fuzz_util.h"

#include "titan/components/tokenizer/tokenizer_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan;
  const std::vector<std::string_view> parts = fuzz::split_input(data, size, "\n--8<--\n");
  const std::string vocab = fuzz::write_input("vocab.json", parts[0]);
  const std::string merges = fuzz::write_input("merges.txt", parts.size() > 1 ? parts[1] : "");
  fuzz::expect_success_or_rejection([&] {
    BpeTokenizer tokenizer(read_gpt2_vocab(vocab, merges));
    tokenizer.decode(tokenizer.encode("Hello world <|endoftext|> 123 \xc3\xa9!"));
  });
  return 0;
}
