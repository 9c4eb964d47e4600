// open_records and the pieces every format shares: extensions, the multi-file row numbering and
// Hugging Face split selection; see record_source.h and row_file.h.
#include "titan/components/data/record_source.h"

#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/common/format.h"
#include "titan/common/logging.h"
#include "titan/components/data/row_file.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <regex>
#include <set>

namespace titan {

namespace fs = std::filesystem;

namespace {

// Rows of files through RowFiles, as a RecordSource.
class FileRecordSource final : public RecordSource {
 public:
  explicit FileRecordSource(std::vector<std::unique_ptr<RowFile>> files)
      : rows_(std::move(files)) {}
  int64_t size() const override { return rows_.size(); }
  std::string describe(int64_t i) const override { return rows_.describe(i); }
  nlohmann::ordered_json record(int64_t i) const override { return rows_.record(i); }
  std::vector<int64_t> span_starts() const override { return rows_.span_starts(); }

 private:
  RowFiles rows_;
};

bool is_record_extension(const std::string& ext) {
  return is_json_extension(ext) || is_parquet_extension(ext);
}

}  // namespace

std::string data_extension(const std::string& path) {
  std::string name = fs::path(path).filename().string();
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const char* compound :
       {".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst", ".jsonl.zstd", ".json.zstd"}) {
    const std::string ext = compound;
    if (name.size() > ext.size() && name.compare(name.size() - ext.size(), ext.size(), ext) == 0) {
      return ext;
    }
  }
  return fs::path(name).extension().string();
}

bool is_json_extension(const std::string& ext) {
  return ext == ".jsonl" || ext == ".json" || ext == ".jsonl.gz" || ext == ".json.gz" ||
         ext == ".jsonl.zst" || ext == ".json.zst" || ext == ".jsonl.zstd" || ext == ".json.zstd";
}

bool is_parquet_extension(const std::string& ext) { return ext == ".parquet"; }

std::unique_ptr<RowFile> open_row_file(const std::string& path, const RowFileOptions& options) {
  const std::string ext = data_extension(path);
  if (is_parquet_extension(ext)) return open_parquet_file(path, options);
  if (is_json_extension(ext)) return open_json_file(path, options);
  if (options.mode == RowMode::kText) return open_text_file(path, options);
  throw DataError(message(path,
                          ": cannot tell its format from the extension (expected .jsonl, "
                          ".json, .jsonl.gz, .jsonl.zst or .parquet). HINT: rename it"));
}

RowFiles::RowFiles(std::vector<std::unique_ptr<RowFile>> files) : files_(std::move(files)) {
  int64_t total = 0;
  for (const auto& file : files_) {
    total += file->size();
    ends_.push_back(total);
  }
}

std::vector<int64_t> RowFiles::span_starts() const {
  std::vector<std::vector<int64_t>> per_file;
  bool any = false;
  for (const auto& file : files_) {
    per_file.push_back(file->span_starts());
    any |= !per_file.back().empty();
  }
  std::vector<int64_t> starts;
  if (!any) return starts;
  for (size_t f = 0; f < files_.size(); ++f) {
    const int64_t base = f == 0 ? 0 : ends_[f - 1];
    if (per_file[f].empty()) {  // every row its own span
      for (int64_t r = 0; r < files_[f]->size(); ++r) starts.push_back(base + r);
    } else {
      for (int64_t r : per_file[f]) starts.push_back(base + r);
    }
  }
  return starts;
}

std::pair<size_t, int64_t> RowFiles::locate(int64_t i) const {
  TITAN_CHECK(i >= 0 && i < size(), "rows: row ", i, " out of range [0, ", size(), ")");
  const auto f =
      static_cast<size_t>(std::upper_bound(ends_.begin(), ends_.end(), i) - ends_.begin());
  return {f, i - (f == 0 ? 0 : ends_[f - 1])};
}

std::string RowFiles::describe(int64_t i) const {
  const auto [f, row] = locate(i);
  return files_[f]->describe(row);
}

std::string RowFiles::text(int64_t i) const {
  const auto [f, row] = locate(i);
  return files_[f]->text(row);
}

nlohmann::ordered_json RowFiles::record(int64_t i) const {
  const auto [f, row] = locate(i);
  return files_[f]->record(row);
}

std::string split_of(const CorpusSettings& settings) {
  return settings.path.rfind("validation.", 0) == 0 ? "validation" : "train";
}

std::vector<std::string> select_split(const std::vector<std::string>& files,
                                      const std::string& split, const std::string& where,
                                      const CorpusSettings& settings) {
  static const std::regex kHubName(R"(([A-Za-z0-9_.]+)-[0-9]{5}-of-[0-9]{5}\.parquet)",
                                   std::regex::icase);
  std::map<std::string, std::vector<std::string>> by_split;
  std::vector<std::string> others;
  for (const std::string& file : files) {
    std::smatch match;
    const std::string name = fs::path(file).filename().string();
    if (std::regex_match(name, match, kHubName)) {
      by_split[match[1].str()].push_back(file);
    } else {
      others.push_back(file);
    }
  }
  if (by_split.empty()) return files;
  std::vector<std::string> candidates{split};
  if (split == "validation") candidates = {"validation", "test", "valid"};
  for (const std::string& name : candidates) {
    auto it = by_split.find(name);
    if (it == by_split.end()) continue;
    if (name != split) {
      log_info("dataset ", where, ": no '", split, "' split; reading '", name, "'");
    }
    std::vector<std::string> selected = it->second;
    selected.insert(selected.end(), others.begin(), others.end());
    std::sort(selected.begin(), selected.end());
    return selected;
  }
  std::vector<std::string> splits;
  for (const auto& entry : by_split) splits.push_back(entry.first);
  throw DataError(message("dataset folder ", where, " holds the splits ", join(splits),
                          " ({split}-NNNNN-of-NNNNN.parquet) but no '", split, "' split. HINT: ",
                          "point ", settings.path, " at the files of the split to read"));
}

std::shared_ptr<const RecordSource> open_records(const std::string& path,
                                                 const CorpusSettings& settings) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (path.empty() || ec || !fs::exists(status)) {
    throw DataError(message("dataset path '", path, "' does not exist. HINT: set ", settings.path,
                            " to a .jsonl, .jsonl.gz, .jsonl.zst, .json or .parquet file or a "
                            "folder of them"));
  }
  std::vector<std::string> files;
  if (!fs::is_directory(status)) {
    require_regular_file(path, "dataset file");
    files.push_back(path);
  } else {
    for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
      if (!it->is_regular_file()) continue;
      if (it->path().filename().string().rfind('.', 0) == 0) continue;  // hidden files
      if (is_record_extension(data_extension(it->path().string()))) {
        files.push_back(it->path().string());
      }
    }
    if (ec) throw DataError(message("cannot list dataset folder ", path, ": ", ec.message()));
    std::sort(files.begin(), files.end());
    if (files.empty()) {
      throw DataError(message("dataset folder ", path,
                              " holds no .jsonl, .jsonl.gz, .jsonl.zst, "
                              ".json or .parquet files"));
    }
    files = select_split(files, split_of(settings), path, settings);
  }
  RowFileOptions options;
  options.mode = RowMode::kRecord;
  options.settings = settings;
  std::vector<std::unique_ptr<RowFile>> readers;
  for (const std::string& file : files) readers.push_back(open_row_file(file, options));
  auto source = std::make_shared<FileRecordSource>(std::move(readers));
  if (source->size() == 0) throw DataError(message("dataset path ", path, " holds no rows"));
  return source;
}

}  // namespace titan
