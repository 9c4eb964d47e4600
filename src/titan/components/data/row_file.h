// One reader per file format, shared by text corpora (DocumentSource: a document is one field of
// a row) and record sources (RecordSource: the whole row). Internal to the data library.
//
// Formats (by the file's extension, see data_extension):
//   .txt                                  one row, the whole file ({"text": ...} as a record);
//   .jsonl .json                          one row per non-blank line; a .json file whose first
//                                         character is '[' is a JSON array of rows instead;
//   .jsonl.gz .json.gz .jsonl.zst .json.zst   the same, compressed (compressed_stream.h);
//   .parquet                              one row per table row (Apache Arrow's reader).
//
// Spans: rows decoded together, because the format can only start decoding at some places
// (a compressed access point, a parquet row group). A file reports the first row of each span;
// reading any row of a span decodes the span, and the file keeps the most recently decoded one,
// so reading the rows of a span one after another decodes it once. A data loader that visits
// spans whole (data_loader.h) decodes each span once per epoch.
//
// Each file is read whole once when opened: every row is checked (JSON, UTF-8, the text field
// present and a string in kText mode), so bad data fails at start, not mid-training; memory stays
// one span.
#pragma once

#include "titan/components/data/dataset.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace titan {

enum class RowMode {
  kText,    // rows must have a string `text_field` (documents)
  kRecord,  // rows are JSON objects (chat and other record datasets)
};

struct RowFileOptions {
  RowMode mode = RowMode::kText;
  std::string text_field = "text";  // kText: the field (parquet: column) holding the text
  CorpusSettings settings;          // keys named in hints
};

class RowFile {
 public:
  virtual ~RowFile() = default;
  virtual int64_t size() const = 0;
  // First row of each span, ascending from 0; empty when every row is its own span.
  virtual std::vector<int64_t> span_starts() const { return {}; }
  // "file.jsonl.gz:12", "train-00000-of-00002.parquet row 17", "a.txt".
  virtual std::string describe(int64_t row) const = 0;
  // The text field of the row (kText mode; in kRecord mode a DataError when it is missing).
  virtual std::string text(int64_t row) const = 0;
  // The whole row as a JSON object, keys in the file's order.
  virtual nlohmann::ordered_json record(int64_t row) const = 0;
};

// The lowercased extension that names a data file's format, compressions included:
// "a/b.JSONL.GZ" -> ".jsonl.gz", "c4-train.00000-of-01024.json.gz" -> ".json.gz", "x.txt" ->
// ".txt", "x.tar.gz" -> ".gz".
std::string data_extension(const std::string& path);
bool is_json_extension(const std::string& ext);  // plain or compressed JSON (lines)
bool is_parquet_extension(const std::string& ext);

// A reader for `path` by its extension; kText mode reads files of unknown extension as text.
std::unique_ptr<RowFile> open_row_file(const std::string& path, const RowFileOptions& options);
// Readers of one format, whatever the extension.
std::unique_ptr<RowFile> open_text_file(const std::string& path, const RowFileOptions& options);
std::unique_ptr<RowFile> open_json_file(const std::string& path, const RowFileOptions& options);
std::unique_ptr<RowFile> open_parquet_file(const std::string& path, const RowFileOptions& options);

// The rows of several files, numbered in file order; spans never cross files.
class RowFiles {
 public:
  explicit RowFiles(std::vector<std::unique_ptr<RowFile>> files);
  int64_t size() const { return ends_.empty() ? 0 : ends_.back(); }
  // Empty when every row of every file is its own span.
  std::vector<int64_t> span_starts() const;
  std::string describe(int64_t i) const;
  std::string text(int64_t i) const;
  nlohmann::ordered_json record(int64_t i) const;

 private:
  std::pair<size_t, int64_t> locate(int64_t i) const;

  std::vector<std::unique_ptr<RowFile>> files_;
  std::vector<int64_t> ends_;  // cumulative row counts
};

// Hugging Face dataset folders name their files {split}-NNNNN-of-NNNNN.parquet (data/ or a
// config's folder). When `files` hold such names, keeps those of `split` (for "validation" also
// accepting "test", then "valid", when there is no validation split); other files pass through.
// DataError naming the splits that exist when none matches.
std::vector<std::string> select_split(const std::vector<std::string>& files,
                                      const std::string& split, const std::string& where,
                                      const CorpusSettings& settings);

// "validation" for a validation section's settings, "train" otherwise.
std::string split_of(const CorpusSettings& settings);

}  // namespace titan
