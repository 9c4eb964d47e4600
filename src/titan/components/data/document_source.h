// Document sources: what the DataLoader pulls documents from, one at a time by index, so a user
// corpus on disk is never loaded whole. A source keeps only a small index in memory (a path per
// file, or a byte offset per JSON line, or a mapped token file) and reads a document when asked.
//
// Kinds of source:
//   MemoryDocumentSource  documents already in memory (the built-in corpora, tests);
//   text files (.txt)     one document per file;
//   JSON lines (.jsonl, .json)  one document per non-blank line, text in a configurable field;
//                         also compressed: .jsonl.gz/.json.gz (c4's files), .jsonl.zst/.json.zst;
//   parquet (.parquet)    one document per row, text in a configurable column;
//   token files (.bin)    pre-tokenized documents, memory-mapped (format: token_file.h).
// Directories are searched recursively and their files taken in sorted path order, so every rank
// and every run sees the same document numbering.
#pragma once

#include "titan/components/data/dataset.h"
#include "titan/components/tokenizer/tokenizer.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace titan {

class DocumentSource {
 public:
  virtual ~DocumentSource() = default;

  // Number of documents.
  virtual int64_t size() const = 0;
  // Where document i comes from, for messages: "file.jsonl:12", "a.txt", "shard.bin doc 7".
  virtual std::string describe(int64_t i) const = 0;
  // Token ids of document i without BOS/EOS: the tokenizer's encoding of its text, or the stored
  // ids of a pre-tokenized source. Throws DataError on unreadable or corrupt data.
  virtual std::vector<int64_t> encode(int64_t i, const Tokenizer& tokenizer) const = 0;
  // Text of document i; throws DataError for a pre-tokenized source.
  virtual std::string text(int64_t i) const = 0;
  // Vocabulary size of the tokenizer that wrote a pre-tokenized source; 0 for text sources.
  virtual int64_t token_vocab_size() const { return 0; }
  // First document of each span (documents decoded together: a compressed file's stretch between
  // access points, a parquet row group), ascending from 0; empty when every document is its own
  // span. The DataLoader's shuffle keeps spans together (data_loader.h).
  virtual std::vector<int64_t> span_starts() const { return {}; }
};

class MemoryDocumentSource final : public DocumentSource {
 public:
  explicit MemoryDocumentSource(std::shared_ptr<const std::vector<Document>> docs);
  int64_t size() const override;
  std::string describe(int64_t i) const override;
  std::vector<int64_t> encode(int64_t i, const Tokenizer& tokenizer) const override;
  std::string text(int64_t i) const override;

 private:
  std::shared_ptr<const std::vector<Document>> docs_;
};

enum class CorpusFormat { kText, kJsonl, kParquet, kTokens, kAuto };

// Parses "text", "jsonl", "parquet", "tokens" or "auto"; throws ConfigError otherwise.
CorpusFormat corpus_format_from_name(const std::string& name);

// The files of `format` at `path` (a file, or a directory searched recursively), sorted.
// Extensions: text .txt, jsonl .jsonl/.json (and .gz, .zst), parquet .parquet, tokens .bin, auto
// any of them. A file named
// directly is accepted whatever its extension unless `format` is kAuto. Files of other
// extensions in a directory are skipped with one warning. Throws DataError when `path` does
// not exist or holds no matching file.
std::vector<std::string> list_corpus_files(const std::string& path, CorpusFormat format,
                                           const CorpusSettings& settings = {});

// A source over the corpus at `path`. `text_field` is the JSON key holding a line's text. With
// kAuto the format follows the extensions; token files cannot be mixed with text files. Every
// row is read once here, so a malformed line fails at start, not mid-training. A folder of
// Hugging Face split files ({split}-NNNNN-of-NNNNN.parquet) gives the split of `settings`
// (train; validation, else test, for the validation section).
std::shared_ptr<const DocumentSource> open_corpus(const std::string& path, CorpusFormat format,
                                                  const std::string& text_field = "text",
                                                  const CorpusSettings& settings = {});

// Separate sources over given files (all of one kind: text files and JSON lines may mix).
std::shared_ptr<const DocumentSource> open_text_corpus(const std::vector<std::string>& files,
                                                       const std::string& text_field,
                                                       const CorpusSettings& settings = {});
std::shared_ptr<const DocumentSource> open_token_corpus(const std::vector<std::string>& files);

}  // namespace titan
