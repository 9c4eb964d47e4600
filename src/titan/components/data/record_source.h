// Record sources: the rows of a dataset as JSON objects, read one at a time by index. Text
// corpora take one field of each row (DocumentSource, the `text` of a JSON line); chat datasets
// take the whole row (`messages`, or the columns a chat mapping names).
//
// A source keeps a small index in memory and reads a row when asked, so a corpus on disk is never
// loaded whole. Rows are numbered in a fixed order (files in sorted path order, then rows in file
// order), the same on every rank and in every run.
#pragma once

#include "titan/components/data/dataset.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace titan {

class RecordSource {
 public:
  virtual ~RecordSource() = default;

  // Number of rows.
  virtual int64_t size() const = 0;
  // Where row i comes from, for messages: "file.jsonl:12", "train-00000-of-00002.parquet row 17".
  virtual std::string describe(int64_t i) const = 0;
  // Row i as a JSON object, keys in the file's order. Throws DataError on unreadable or corrupt
  // data, naming the file (and the byte offset where the format has one).
  virtual nlohmann::ordered_json record(int64_t i) const = 0;
  // First row of each span (rows decoded together: a compressed file's stretch between access
  // points, a parquet row group), ascending from 0; empty when every row is its own span.
  // Reading the rows of one span one after another decodes it once.
  virtual std::vector<int64_t> span_starts() const { return {}; }
};

// Rows held in memory (tests, small built-in sets).
class MemoryRecordSource final : public RecordSource {
 public:
  MemoryRecordSource(std::vector<nlohmann::ordered_json> rows, std::string name = "memory")
      : rows_(std::move(rows)), name_(std::move(name)) {}
  int64_t size() const override { return static_cast<int64_t>(rows_.size()); }
  std::string describe(int64_t i) const override { return name_ + " row " + std::to_string(i); }
  nlohmann::ordered_json record(int64_t i) const override { return rows_.at(i); }

 private:
  std::vector<nlohmann::ordered_json> rows_;
  std::string name_;
};

// The rows of the dataset at `path` (a file, or a folder searched recursively, files in sorted
// path order), format by extension: JSON lines (.jsonl, .jsonl.gz, .jsonl.zst), JSON (.json: an
// array of objects, or JSON lines) and parquet (.parquet; a Hugging Face dataset folder's
// data/{split}-NNNNN-of-NNNNN.parquet files). `settings` name the keys in error hints. Throws
// DataError when `path` does not exist, holds no such file, or a file is corrupt.
std::shared_ptr<const RecordSource> open_records(const std::string& path,
                                                 const CorpusSettings& settings = {});

}  // namespace titan
