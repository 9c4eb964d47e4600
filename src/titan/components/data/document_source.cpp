// Document sources over memory, text files, JSON lines and token files; see document_source.h.
#include "titan/components/data/document_source.h"

#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/common/logging.h"
#include "titan/components/data/row_file.h"
#include "titan/components/data/token_file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

namespace titan {

namespace fs = std::filesystem;

namespace {

std::string extension_of(const std::string& path) { return data_extension(path); }

bool is_jsonl_ext(const std::string& ext) { return is_json_extension(ext); }

bool matches(CorpusFormat format, const std::string& ext) {
  switch (format) {
    case CorpusFormat::kText: return ext == ".txt";
    case CorpusFormat::kJsonl: return is_jsonl_ext(ext);
    case CorpusFormat::kParquet: return is_parquet_extension(ext);
    case CorpusFormat::kTokens: return ext == ".bin";
    case CorpusFormat::kAuto:
      return ext == ".txt" || is_jsonl_ext(ext) || is_parquet_extension(ext) || ext == ".bin";
  }
  return false;
}

const char* extensions_of(CorpusFormat format) {
  switch (format) {
    case CorpusFormat::kText: return ".txt";
    case CorpusFormat::kJsonl: return ".jsonl/.json (plain, .gz or .zst)";
    case CorpusFormat::kParquet: return ".parquet";
    case CorpusFormat::kTokens: return ".bin";
    case CorpusFormat::kAuto: return ".txt/.jsonl/.json (plain, .gz or .zst)/.parquet/.bin";
  }
  return "";
}

// Text files (one document each), JSON lines (one document per non-blank line, plain or
// compressed) and parquet files (one document per row), read by the per-format readers of
// row_file.h; a document is a row's text field.
class TextCorpusSource final : public DocumentSource {
 public:
  // `format` kText reads every file as text, kJsonl every file as JSON lines (parquet files
  // still as parquet); kAuto and kParquet go by extension.
  TextCorpusSource(const std::vector<std::string>& files, const std::string& text_field,
                   CorpusFormat format, const CorpusSettings& settings)
      : rows_(open_files(files, text_field, format, settings)) {}

  int64_t size() const override { return rows_.size(); }
  std::string describe(int64_t i) const override { return rows_.describe(i); }
  std::vector<int64_t> encode(int64_t i, const Tokenizer& tokenizer) const override {
    return tokenizer.encode(text(i));
  }
  std::string text(int64_t i) const override { return rows_.text(i); }
  std::vector<int64_t> span_starts() const override { return rows_.span_starts(); }

 private:
  static std::vector<std::unique_ptr<RowFile>> open_files(const std::vector<std::string>& files,
                                                          const std::string& text_field,
                                                          CorpusFormat format,
                                                          const CorpusSettings& settings) {
    RowFileOptions options;
    options.mode = RowMode::kText;
    options.text_field = text_field;
    options.settings = settings;
    std::vector<std::unique_ptr<RowFile>> readers;
    for (const std::string& file : files) {
      const std::string ext = extension_of(file);
      if (format == CorpusFormat::kText) {
        readers.push_back(open_text_file(file, options));
      } else if (is_parquet_extension(ext)) {
        readers.push_back(open_parquet_file(file, options));
      } else if (format == CorpusFormat::kJsonl || is_jsonl_ext(ext)) {
        readers.push_back(open_json_file(file, options));
      } else {
        readers.push_back(open_text_file(file, options));
      }
    }
    return readers;
  }

  RowFiles rows_;
};

// Token files, each memory-mapped; documents are numbered across files in file order.
class TokenCorpusSource final : public DocumentSource {
 public:
  explicit TokenCorpusSource(const std::vector<std::string>& files) {
    int64_t total = 0;
    for (const std::string& path : files) {
      auto reader = std::make_unique<TokenFileReader>(path);
      // As an empty .txt file: its documents would be BOS and EOS alone, re-looped every window.
      if (reader->num_tokens() == 0) {
        throw DataError("token file " + path + " holds no tokens (" +
                        std::to_string(reader->num_documents()) +
                        " empty documents); training would see only BOS and EOS. HINT: remove "
                        "it, or regenerate it with `titan data prepare` from a non-empty input");
      }
      if (!readers_.empty() && reader->vocab_size() != readers_[0]->vocab_size()) {
        throw DataError("token file " + path + " has vocab_size " +
                        std::to_string(reader->vocab_size()) + " but " + readers_[0]->path() +
                        " has " + std::to_string(readers_[0]->vocab_size()) +
                        "; all shards must come from one tokenizer");
      }
      total += reader->num_documents();
      readers_.push_back(std::move(reader));
      ends_.push_back(total);
    }
  }

  int64_t size() const override { return ends_.empty() ? 0 : ends_.back(); }

  std::string describe(int64_t i) const override {
    const auto [r, local] = locate(i);
    return readers_[r]->path() + " document " + std::to_string(local);
  }

  std::vector<int64_t> encode(int64_t i, const Tokenizer& /*tokenizer*/) const override {
    const auto [r, local] = locate(i);
    return readers_[r]->document(local);
  }

  std::string text(int64_t i) const override {
    throw DataError(describe(i) + " is pre-tokenized; it has no text");
  }

  int64_t token_vocab_size() const override {
    return readers_.empty() ? 0 : readers_[0]->vocab_size();
  }

 private:
  std::pair<size_t, int64_t> locate(int64_t i) const {
    TITAN_CHECK(i >= 0 && i < size(), "token corpus: document ", i, " out of range");
    const auto r =
        static_cast<size_t>(std::upper_bound(ends_.begin(), ends_.end(), i) - ends_.begin());
    return {r, i - (r == 0 ? 0 : ends_[r - 1])};
  }

  std::vector<std::unique_ptr<TokenFileReader>> readers_;
  std::vector<int64_t> ends_;  // cumulative document counts
};

}  // namespace

MemoryDocumentSource::MemoryDocumentSource(std::shared_ptr<const std::vector<Document>> docs)
    : docs_(std::move(docs)) {
  TITAN_CHECK(docs_ != nullptr, "MemoryDocumentSource: documents must not be null");
}

int64_t MemoryDocumentSource::size() const { return static_cast<int64_t>(docs_->size()); }

std::string MemoryDocumentSource::describe(int64_t i) const { return docs_->at(i).name; }

std::vector<int64_t> MemoryDocumentSource::encode(int64_t i, const Tokenizer& tokenizer) const {
  return tokenizer.encode(docs_->at(i).text);
}

std::string MemoryDocumentSource::text(int64_t i) const { return docs_->at(i).text; }

CorpusFormat corpus_format_from_name(const std::string& name) {
  if (name == "text") return CorpusFormat::kText;
  if (name == "jsonl") return CorpusFormat::kJsonl;
  if (name == "parquet") return CorpusFormat::kParquet;
  if (name == "tokens") return CorpusFormat::kTokens;
  if (name == "auto") return CorpusFormat::kAuto;
  throw ConfigError(
      message("unknown corpus format '", name, "'; expected text, jsonl, parquet, tokens or auto"));
}

CorpusSettings CorpusSettings::of_section(const std::string& section) {
  return CorpusSettings{section + ".dataset_path", section + ".dataset",
                        section + ".dataset_text_field"};
}

CorpusSettings CorpusSettings::of_prepare() {
  return CorpusSettings{"--input", "", "--text-field"};
}

std::vector<std::string> list_corpus_files(const std::string& path, CorpusFormat format,
                                           const CorpusSettings& settings) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (path.empty() || ec || !fs::exists(status)) {
    throw DataError("dataset path '" + path + "' does not exist. HINT: set " + settings.path +
                    " to a " + extensions_of(format) + " file or a folder of them");
  }
  std::vector<std::string> files;
  if (!fs::is_directory(status)) {
    require_regular_file(path, "dataset file");  // a FIFO would hang, /dev/zero fill memory
    if (format == CorpusFormat::kAuto && !matches(format, extension_of(path))) {
      const std::string hint = settings.format.empty() ? "rename it to one of those extensions"
                                                       : "name the format: " + settings.format +
                                                             " = text, jsonl, parquet or tokens";
      throw DataError(path + ": cannot tell its format from the extension (expected " +
                      std::string(extensions_of(format)) + "). HINT: " + hint);
    }
    return {path};
  }
  int64_t skipped = 0;
  std::string example;
  for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file()) {
      continue;
    }
    const std::string file = it->path().string();
    if (it->path().filename().string().rfind('.', 0) == 0) {
      continue;  // hidden files
    }
    if (matches(format, extension_of(file))) {
      files.push_back(file);
    } else {
      ++skipped;
      example = file;
    }
  }
  if (ec) {
    throw DataError("cannot list dataset folder " + path + ": " + ec.message());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    throw DataError("dataset folder " + path + " holds no " + extensions_of(format) + " files");
  }
  if (skipped > 0) {
    log_warning("dataset folder ", path, ": skipped ", skipped, " file(s) without a ",
                extensions_of(format), " extension, e.g. ", example);
  }
  return files;
}

std::shared_ptr<const DocumentSource> open_text_corpus(const std::vector<std::string>& files,
                                                       const std::string& text_field,
                                                       const CorpusSettings& settings) {
  return std::make_shared<TextCorpusSource>(files, text_field, CorpusFormat::kAuto, settings);
}

std::shared_ptr<const DocumentSource> open_token_corpus(const std::vector<std::string>& files) {
  return std::make_shared<TokenCorpusSource>(files);
}

std::shared_ptr<const DocumentSource> open_corpus(const std::string& path, CorpusFormat format,
                                                  const std::string& text_field,
                                                  const CorpusSettings& settings) {
  std::vector<std::string> files = list_corpus_files(path, format, settings);
  if (fs::is_directory(path)) files = select_split(files, split_of(settings), path, settings);
  size_t num_bin = 0;
  for (const std::string& f : files) {
    num_bin += extension_of(f) == ".bin" ? 1 : 0;
  }
  const bool tokens =
      format == CorpusFormat::kTokens || (format == CorpusFormat::kAuto && num_bin == files.size());
  if (format == CorpusFormat::kAuto && num_bin != 0 && num_bin != files.size()) {
    throw DataError("dataset path " + path + " mixes token files (.bin) with text files; " +
                    "HINT: point " + settings.path + " at one kind");
  }
  std::shared_ptr<const DocumentSource> source =
      tokens ? open_token_corpus(files)
             : std::make_shared<TextCorpusSource>(files, text_field, format, settings);
  if (source->size() == 0) {
    throw DataError("dataset path " + path + " holds no documents");
  }
  return source;
}

}  // namespace titan
