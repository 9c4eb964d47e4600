// Fuzzes SentencePiece model reading (read_sentencepiece_model: the protocol-buffer walk, piece
// types, the normalizer's precompiled charsmap) and the UnigramTokenizer checks it feeds; a
// tokenizer that loads must encode and decode a short text (the charsmap's trie is walked).
#include "fuzz_util.h"

#include "titan/components/tokenizer/tokenizer_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan;
  fuzz::parse_input_file("spiece.model", data, size, [](const std::string& path) {
    UnigramTokenizer tokenizer(read_sentencepiece_model(path, 3));
    const std::vector<int64_t> ids =
        tokenizer.encode("Hello  w\xc3\xb6rld <extra_id_0> 123 \xef\xbc\xa1\xcc\x81 </s>!");
    tokenizer.decode(ids);
  });
  return 0;
}
