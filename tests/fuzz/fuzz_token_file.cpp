// Fuzzes pre-tokenized token files (.bin, token_file.h: header, sizes, document offsets) through
// TokenFileReader, then reads the first documents (ids checked against the recorded vocab_size).
#include "fuzz_util.h"

#include "titan/components/data/token_file.h"

#include <algorithm>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan;
  fuzz::parse_input_file("shard.bin", data, size, [](const std::string& path) {
    TokenFileReader reader(path);
    for (int64_t i = 0; i < std::min<int64_t>(reader.num_documents(), 16); ++i) {
      reader.document(i);
    }
  });
  return 0;
}
