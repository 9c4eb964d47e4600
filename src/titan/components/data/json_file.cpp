// Readers of text files and of JSON (lines), plain or compressed; see row_file.h.
//
// Plain JSON lines keep the byte offset of every row and seek to it (every row its own span).
// Compressed ones keep, per span of about kSpanBytes of decompressed text, an access point of the
// decoder (compressed_stream.h), the bytes from it to the span's first row and that row's number
// and line: the index is a few numbers (and, for gzip, a 32 KiB window) per MiB of text.
#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/components/data/compressed_stream.h"
#include "titan/components/data/row_file.h"
#include "titan/components/tokenizer/unicode.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <string_view>

namespace titan {

namespace {

// Decompressed bytes between access points that start a new span.
constexpr uint64_t kSpanBytes = 1 << 20;
constexpr size_t kChunkBytes = 256 * 1024;

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

// Text must be UTF-8 in every format: DataError naming the place and the byte offset.
void require_utf8(std::string_view text, const std::string& where, uint64_t offset,
                  bool decompressed) {
  const size_t bad = find_invalid_utf8(text);
  if (bad == std::string_view::npos) return;
  char byte[8];
  std::snprintf(byte, sizeof(byte), "0x%02X", static_cast<unsigned char>(text[bad]));
  throw DataError(where + ": invalid UTF-8 at " + (decompressed ? "decompressed " : "") +
                  "byte offset " + std::to_string(offset + bad) + " (byte " + byte +
                  "); text corpora must be UTF-8. HINT: convert the file " +
                  "(e.g. iconv -f latin1 -t utf-8) or remove it");
}

// Splits a stream of chunks into lines (without '\n'), each with the offset of its first byte.
class LineSplitter {
 public:
  // `on_line` returns false to stop; feed() then returns false too.
  using Callback = std::function<bool(std::string_view line, uint64_t start)>;

  explicit LineSplitter(uint64_t start) : line_start_(start) {}

  bool feed(std::string_view chunk, const Callback& on_line) {
    size_t begin = 0;
    while (begin < chunk.size()) {
      const size_t newline = chunk.find('\n', begin);
      if (newline == std::string_view::npos) {
        partial_.append(chunk.substr(begin));
        return true;
      }
      const std::string_view piece = chunk.substr(begin, newline - begin);
      const uint64_t start = line_start_;
      line_start_ += partial_.size() + piece.size() + 1;
      bool go_on;
      if (partial_.empty()) {
        go_on = on_line(piece, start);
      } else {
        partial_.append(piece);
        go_on = on_line(partial_, start);
        partial_.clear();
      }
      begin = newline + 1;
      if (!go_on) return false;
    }
    return true;
  }

  // The last line when the data does not end with '\n'.
  void finish(const Callback& on_line) {
    if (!partial_.empty()) on_line(partial_, line_start_);
    partial_.clear();
  }

 private:
  std::string partial_;
  uint64_t line_start_;  // offset of the line being read
};

// One .txt file: one row, read whole when asked.
class TextFile final : public RowFile {
 public:
  TextFile(std::string path, const RowFileOptions& options)
      : path_(std::move(path)), field_(options.text_field) {
    const std::string text = read_regular_file(path_, "dataset file");
    if (text.empty()) {
      throw DataError(path_ + ": empty file; a .txt file is one document. HINT: remove it");
    }
    require_utf8(text, path_, 0, false);
  }
  int64_t size() const override { return 1; }
  std::string describe(int64_t /*row*/) const override { return path_; }
  std::string text(int64_t /*row*/) const override {
    std::ifstream in(path_, std::ios::binary);
    if (!in) {
      const int err = errno;
      throw DataError("cannot read " + path_ + ": " + std::strerror(err) +
                      "; it was read when the dataset was opened, so it was removed, replaced or "
                      "made unreadable since");
    }
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  nlohmann::ordered_json record(int64_t row) const override {
    nlohmann::ordered_json object;
    object[field_] = text(row);
    return object;
  }

 private:
  std::string path_;
  std::string field_;
};

// JSON lines (or a JSON array in a plain .json file), plain or compressed.
class JsonFile final : public RowFile {
 public:
  JsonFile(std::string path, const RowFileOptions& options)
      : path_(std::move(path)), options_(options), compression_(compression_of(path_)) {
    if (compression_ == Compression::kNone) {
      index_plain();
    } else {
      index_compressed();
    }
    if (rows_ == 0) {
      throw DataError(path_ + (lines_ == 0 ? ": empty file" : ": only blank lines") +
                      "; a JSON-lines file needs one document per line. HINT: remove it");
    }
    // Like an empty .txt file: documents of BOS and EOS alone would train on nothing.
    if (options_.mode == RowMode::kText && !any_text_) {
      throw DataError(path_ + ": every line's \"" + options_.text_field + "\" is empty; the " +
                      "file holds no text. HINT: check " + options_.settings.text_field +
                      ", or remove the file");
    }
  }

  int64_t size() const override { return rows_; }

  std::vector<int64_t> span_starts() const override {
    std::vector<int64_t> starts;
    if (compression_ == Compression::kNone) return starts;
    starts.reserve(spans_.size());
    for (const Span& span : spans_) starts.push_back(span.first_row);
    return starts;
  }

  std::string describe(int64_t row) const override {
    if (!array_.empty()) return path_ + " element " + std::to_string(row);
    if (compression_ == Compression::kNone) {
      return path_ + ":" + std::to_string(entries_.at(row).line);
    }
    const auto [decoded, local] = decode(row);
    return path_ + ":" + std::to_string(decoded->lines[local]);
  }

  std::string text(int64_t row) const override { return text_of(record(row), describe(row)); }

  nlohmann::ordered_json record(int64_t row) const override {
    TITAN_CHECK(row >= 0 && row < rows_, path_, ": row ", row, " out of range");
    if (!array_.empty()) return array_[row];
    if (compression_ == Compression::kNone) {
      const Entry& e = entries_[row];
      std::ifstream in(path_, std::ios::binary);
      if (!in) {
        const int err = errno;
        throw DataError("cannot read " + describe(row) + ": " + std::strerror(err) +
                        "; it was read when the dataset was opened, so it was removed, "
                        "replaced or made unreadable since");
      }
      in.seekg(static_cast<std::streamoff>(e.offset));
      std::string line;
      if (!std::getline(in, line)) {
        throw DataError("cannot read " + describe(row) + ": the file shrank since it was indexed");
      }
      return parse(line, path_ + ":" + std::to_string(e.line));
    }
    const auto [decoded, local] = decode(row);
    return parse(decoded->rows[local], path_ + ":" + std::to_string(decoded->lines[local]));
  }

 private:
  struct Entry {
    uint64_t offset;  // byte offset of the line
    int64_t line;     // 1-based line number
  };
  struct Span {
    size_t point;   // index into points_
    uint64_t skip;  // decompressed bytes from the point to the span's first row
    int64_t first_row;
    int64_t first_line;  // 1-based line number of first_row
  };
  struct DecodedSpan {
    int64_t span = -1;
    std::vector<std::string> rows;
    std::vector<int64_t> lines;
  };

  // Row `line` as a JSON object; DataError naming `where` otherwise.
  nlohmann::ordered_json parse(std::string_view line, const std::string& where) const {
    nlohmann::ordered_json value;
    try {
      value = nlohmann::ordered_json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(where + ": malformed JSON line (" + e.what() + ")");
    }
    if (!value.is_object()) {
      throw DataError(where + ": expected a JSON object" +
                      (options_.mode == RowMode::kText
                           ? " with a \"" + options_.text_field + "\" field"
                           : std::string()) +
                      ", got a " + value.type_name());
    }
    return value;
  }

  std::string text_of(const nlohmann::ordered_json& value, const std::string& where) const {
    auto it = value.find(options_.text_field);
    if (it == value.end()) {
      throw DataError(where + ": no \"" + options_.text_field + "\" field. HINT: set " +
                      options_.settings.text_field + " to the key that holds the text");
    }
    if (!it->is_string()) {
      throw DataError(where + ": field \"" + options_.text_field + "\" is a " + it->type_name() +
                      ", not a string");
    }
    return it->get<std::string>();
  }

  // Checks one non-blank line as it is indexed.
  void check_line(std::string_view line, int64_t line_no, uint64_t start) {
    const std::string where = path_ + ":" + std::to_string(line_no);
    require_utf8(line, where, start, compression_ != Compression::kNone);
    const nlohmann::ordered_json value = parse(line, where);
    if (options_.mode == RowMode::kText) any_text_ |= !text_of(value, where).empty();
  }

  void index_plain() {
    std::ifstream in(path_, std::ios::binary);
    if (!in) throw DataError("cannot read " + path_);
    // A .json file may be one JSON array of rows.
    char first = 0;
    while (in.get(first) && std::isspace(static_cast<unsigned char>(first))) {
    }
    if (in && first == '[' && data_extension(path_) == ".json") {
      index_array();
      return;
    }
    in.clear();
    in.seekg(0);
    uint64_t offset = 0;
    std::string line;
    while (std::getline(in, line)) {
      ++lines_;
      const uint64_t start = offset;
      offset += line.size() + 1;
      if (is_blank(line)) continue;  // blank lines (e.g. a trailing newline) separate nothing
      check_line(line, lines_, start);
      entries_.push_back(Entry{start, lines_});
      ++rows_;
    }
  }

  void index_array() {
    const std::string content = read_regular_file(path_, "dataset file");
    require_utf8(content, path_, 0, false);
    nlohmann::ordered_json value;
    try {
      value = nlohmann::ordered_json::parse(content);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(path_ + ": malformed JSON (" + e.what() + ")");
    }
    lines_ = 1;
    for (size_t i = 0; i < value.size(); ++i) {
      const std::string where = path_ + " element " + std::to_string(i);
      if (!value[i].is_object()) {
        throw DataError(where + ": expected a JSON object, got a " + value[i].type_name());
      }
      if (options_.mode == RowMode::kText) any_text_ |= !text_of(value[i], where).empty();
      array_.push_back(std::move(value[i]));
    }
    rows_ = static_cast<int64_t>(array_.size());
  }

  // Streams the file once: checks every line and marks an access point about every kSpanBytes.
  // A span starts at the first row that begins after its access point.
  void index_compressed() {
    std::unique_ptr<Decompressor> decoder = Decompressor::open(path_, compression_);
    AccessPoint pending;  // the file's start
    bool have_pending = true;
    uint64_t last_mark = 0;
    LineSplitter splitter(0);
    const LineSplitter::Callback on_line = [&](std::string_view line, uint64_t start) {
      ++lines_;
      if (is_blank(line)) return true;
      check_line(line, lines_, start);
      if (have_pending && pending.out <= start) {
        points_.push_back(std::move(pending));
        have_pending = false;
        spans_.push_back(Span{points_.size() - 1, start - points_.back().out, rows_, lines_});
      }
      ++rows_;
      return true;
    };
    std::string chunk(kChunkBytes, '\0');
    while (const size_t n = decoder->read(chunk.data(), chunk.size())) {
      splitter.feed(std::string_view(chunk.data(), n), on_line);
      if (decoder->at_access_point() && decoder->out_offset() - last_mark >= kSpanBytes) {
        pending = decoder->mark();
        have_pending = true;
        last_mark = pending.out;
      }
    }
    splitter.finish(on_line);
  }

  // The decoded span holding `row` (the cached one when it is), and the row's place in it.
  std::pair<std::shared_ptr<const DecodedSpan>, size_t> decode(int64_t row) const {
    TITAN_CHECK(row >= 0 && row < rows_, path_, ": row ", row, " out of range");
    const auto it = std::upper_bound(spans_.begin(), spans_.end(), row,
                                     [](int64_t r, const Span& s) { return r < s.first_row; });
    const auto s = static_cast<int64_t>(it - spans_.begin()) - 1;
    const size_t local = static_cast<size_t>(row - spans_[s].first_row);
    std::lock_guard<std::mutex> lock(mutex_);
    if (cache_ == nullptr || cache_->span != s) {
      cache_ = decode_span(s);
    }
    return {cache_, local};
  }

  std::shared_ptr<const DecodedSpan> decode_span(int64_t s) const {
    const Span& span = spans_[s];
    const int64_t count =
        (s + 1 < static_cast<int64_t>(spans_.size()) ? spans_[s + 1].first_row : rows_) -
        span.first_row;
    auto decoded = std::make_shared<DecodedSpan>();
    decoded->span = s;
    const AccessPoint& point = points_[span.point];
    std::unique_ptr<Decompressor> decoder = Decompressor::open(path_, compression_, point);
    LineSplitter splitter(point.out + span.skip);
    int64_t line_no = span.first_line;
    const LineSplitter::Callback on_line = [&](std::string_view line, uint64_t /*start*/) {
      if (!is_blank(line)) {
        decoded->rows.emplace_back(line);
        decoded->lines.push_back(line_no);
      }
      ++line_no;
      return static_cast<int64_t>(decoded->rows.size()) < count;
    };
    std::string chunk(kChunkBytes, '\0');
    uint64_t skip = span.skip;
    bool more = true;
    while (more) {
      const size_t n = decoder->read(chunk.data(), chunk.size());
      if (n == 0) {
        splitter.finish(on_line);
        break;
      }
      const size_t drop = static_cast<size_t>(std::min<uint64_t>(skip, n));
      skip -= drop;
      more = splitter.feed(std::string_view(chunk.data() + drop, n - drop), on_line);
    }
    if (static_cast<int64_t>(decoded->rows.size()) != count) {
      throw DataError(path_ + ": the file changed since it was indexed (span from line " +
                      std::to_string(span.first_line) + " holds " +
                      std::to_string(decoded->rows.size()) + " rows, expected " +
                      std::to_string(count) + ")");
    }
    return decoded;
  }

  std::string path_;
  RowFileOptions options_;
  Compression compression_;
  int64_t rows_ = 0;
  int64_t lines_ = 0;
  bool any_text_ = false;
  std::vector<Entry> entries_;                 // plain JSON lines
  std::vector<nlohmann::ordered_json> array_;  // a .json array
  std::vector<AccessPoint> points_;            // compressed
  std::vector<Span> spans_;                    // compressed
  mutable std::mutex mutex_;
  mutable std::shared_ptr<const DecodedSpan> cache_;
};

}  // namespace

std::unique_ptr<RowFile> open_text_file(const std::string& path, const RowFileOptions& options) {
  return std::make_unique<TextFile>(path, options);
}

std::unique_ptr<RowFile> open_json_file(const std::string& path, const RowFileOptions& options) {
  require_regular_file(path, "dataset file");  // a FIFO would hang, /dev/zero fill memory
  return std::make_unique<JsonFile>(path, options);
}

}  // namespace titan
