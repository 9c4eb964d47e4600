// Document sources over memory, text files, JSON lines and token files; see document_source.h.
#include "titan/components/data/document_source.h"

#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/common/logging.h"
#include "titan/components/data/token_file.h"
#include "titan/components/tokenizer/unicode.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

namespace titan {

namespace fs = std::filesystem;

namespace {

std::string extension_of(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

bool is_jsonl_ext(const std::string& ext) { return ext == ".jsonl" || ext == ".json"; }

// Text must be UTF-8 in every format: DataError naming the place and the file's byte offset.
void check_utf8(std::string_view text, const std::string& where, uint64_t file_offset) {
  const size_t bad = find_invalid_utf8(text);
  if (bad == std::string_view::npos) return;
  char byte[8];
  std::snprintf(byte, sizeof(byte), "0x%02X", static_cast<unsigned char>(text[bad]));
  throw DataError(where + ": invalid UTF-8 at byte offset " + std::to_string(file_offset + bad) +
                  " (byte " + byte + "); text corpora must be UTF-8. HINT: convert the file " +
                  "(e.g. iconv -f latin1 -t utf-8) or remove it");
}

bool matches(CorpusFormat format, const std::string& ext) {
  switch (format) {
    case CorpusFormat::kText: return ext == ".txt";
    case CorpusFormat::kJsonl: return is_jsonl_ext(ext);
    case CorpusFormat::kTokens: return ext == ".bin";
    case CorpusFormat::kAuto: return ext == ".txt" || is_jsonl_ext(ext) || ext == ".bin";
  }
  return false;
}

const char* extensions_of(CorpusFormat format) {
  switch (format) {
    case CorpusFormat::kText: return ".txt";
    case CorpusFormat::kJsonl: return ".jsonl/.json";
    case CorpusFormat::kTokens: return ".bin";
    case CorpusFormat::kAuto: return ".txt/.jsonl/.json/.bin";
  }
  return "";
}

// Text files (one document each) and JSON-lines files (one document per non-blank line). The
// index holds one entry per document: its file and, for a JSON line, the line's byte offset.
class TextCorpusSource final : public DocumentSource {
 public:
  // `format` kText or kJsonl reads every file as that; kAuto goes by extension.
  TextCorpusSource(std::vector<std::string> files, std::string text_field, CorpusFormat format,
                   CorpusSettings settings)
      : files_(std::move(files)),
        text_field_(std::move(text_field)),
        settings_(std::move(settings)) {
    for (size_t f = 0; f < files_.size(); ++f) {
      if (format == CorpusFormat::kJsonl ||
          (format != CorpusFormat::kText && is_jsonl_ext(extension_of(files_[f])))) {
        index_jsonl(f);
      } else {
        index_text(f);
      }
    }
  }

  int64_t size() const override { return static_cast<int64_t>(entries_.size()); }

  std::string describe(int64_t i) const override {
    const Entry& e = entries_.at(i);
    return e.line == 0 ? files_[e.file] : files_[e.file] + ":" + std::to_string(e.line);
  }

  std::vector<int64_t> encode(int64_t i, const Tokenizer& tokenizer) const override {
    return tokenizer.encode(text(i));
  }

  std::string text(int64_t i) const override {
    const Entry& e = entries_.at(i);
    const std::string& path = files_[e.file];
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      const int err = errno;
      throw DataError("cannot read " + describe(i) + ": " + std::strerror(err) +
                      "; it was read when the dataset was opened, so it was removed, replaced or "
                      "made unreadable since");
    }
    if (e.line == 0) {  // a whole text file
      std::ostringstream ss;
      ss << in.rdbuf();
      return ss.str();
    }
    in.seekg(static_cast<std::streamoff>(e.offset));
    std::string line;
    if (!std::getline(in, line)) {
      throw DataError("cannot read " + describe(i) + ": the file shrank since it was indexed");
    }
    return parse_line(line, e.file, e.line);
  }

 private:
  struct Entry {
    uint32_t file;
    uint32_t line;    // 1-based line of a JSON line; 0 for a whole text file
    uint64_t offset;  // byte offset of that line
  };

  // The text field of one JSON line; DataError naming file:line otherwise.
  std::string parse_line(const std::string& line, size_t file, uint32_t line_no) const {
    const std::string where = files_[file] + ":" + std::to_string(line_no);
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(where + ": malformed JSON line (" + e.what() + ")");
    }
    if (!value.is_object()) {
      throw DataError(where + ": expected a JSON object with a \"" + text_field_ +
                      "\" field, got a " + value.type_name());
    }
    auto it = value.find(text_field_);
    if (it == value.end()) {
      throw DataError(where + ": no \"" + text_field_ + "\" field. HINT: set " +
                      settings_.text_field + " to the key that holds the text");
    }
    if (!it->is_string()) {
      throw DataError(where + ": field \"" + text_field_ + "\" is a " + it->type_name() +
                      ", not a string");
    }
    return it->get<std::string>();
  }

  // Reads the file once, as JSON lines are, so that bad text fails at start, not mid-training.
  void index_text(size_t f) {
    const std::string text = read_regular_file(files_[f], "dataset file");
    if (text.empty()) {
      throw DataError(files_[f] + ": empty file; a .txt file is one document. HINT: remove it");
    }
    check_utf8(text, files_[f], 0);
    entries_.push_back(Entry{static_cast<uint32_t>(f), 0, 0});
  }

  // Reads the file one line at a time: memory is one line, whatever the file size.
  void index_jsonl(size_t f) {
    std::ifstream in(files_[f], std::ios::binary);
    if (!in) {
      throw DataError("cannot read " + files_[f]);
    }
    const size_t before = entries_.size();
    uint64_t offset = 0;
    uint32_t line_no = 0;
    bool any_text = false;
    std::string line;
    while (std::getline(in, line)) {
      ++line_no;
      const uint64_t start = offset;
      offset += line.size() + 1;
      if (line.find_first_not_of(" \t\r") == std::string::npos) {
        continue;  // blank lines (e.g. a trailing newline) separate nothing
      }
      check_utf8(line, files_[f] + ":" + std::to_string(line_no), start);
      any_text |= !parse_line(line, f, line_no).empty();
      entries_.push_back(Entry{static_cast<uint32_t>(f), line_no, start});
    }
    if (entries_.size() == before) {
      throw DataError(files_[f] + (line_no == 0 ? ": empty file" : ": only blank lines") +
                      "; a JSON-lines file needs one document per line. HINT: remove it");
    }
    // Like an empty .txt file: documents of BOS and EOS alone would train on nothing.
    if (!any_text) {
      throw DataError(files_[f] + ": every line's \"" + text_field_ + "\" is empty; the file " +
                      "holds no text. HINT: check " + settings_.text_field +
                      ", or remove the file");
    }
  }

  std::vector<std::string> files_;
  std::string text_field_;
  CorpusSettings settings_;
  std::vector<Entry> entries_;
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
  if (name == "tokens") return CorpusFormat::kTokens;
  if (name == "auto") return CorpusFormat::kAuto;
  throw ConfigError(
      message("unknown corpus format '", name, "'; expected text, jsonl, tokens or auto"));
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
                                                             " = text, jsonl or tokens";
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
  const std::vector<std::string> files = list_corpus_files(path, format, settings);
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
