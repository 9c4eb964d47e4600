// Fuzzes JSON-lines corpora (open_corpus with format jsonl: one document per non-blank line, text
// in the "text" field, every line parsed at open), then reads and encodes the first documents.
#include "fuzz_util.h"

#include "titan/components/data/document_source.h"

#include <algorithm>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan;
  fuzz::parse_input_file("corpus.jsonl", data, size, [](const std::string& path) {
    const auto source = open_corpus(path, CorpusFormat::kJsonl, "text");
    const ByteTokenizer tokenizer;
    for (int64_t i = 0; i < std::min<int64_t>(source->size(), 16); ++i) {
      source->describe(i);
      source->text(i);
      source->encode(i, tokenizer);
    }
  });
  return 0;
}
