// The c4 datasets from local files; see c4.h.
#include "titan/components/data/c4.h"

#include "titan/common/check.h"
#include "titan/components/data/document_source.h"

#include <algorithm>
#include <filesystem>
#include <regex>

namespace titan {

namespace fs = std::filesystem;

namespace {

// Folders under `path` where en/ may sit: path, and a hub cache's snapshots.
std::vector<fs::path> c4_roots(const fs::path& path) {
  std::vector<fs::path> roots{path};
  std::vector<fs::path> repos;
  if (fs::is_directory(path / "datasets--allenai--c4"))
    repos.push_back(path / "datasets--allenai--c4");
  if (fs::is_directory(path / "snapshots")) repos.push_back(path);
  for (const fs::path& repo : repos) {
    std::vector<fs::path> snapshots;
    std::error_code ec;
    for (fs::directory_iterator it(repo / "snapshots", ec), end; !ec && it != end;
         it.increment(ec)) {
      if (it->is_directory()) snapshots.push_back(it->path());
    }
    std::sort(snapshots.begin(), snapshots.end());
    roots.insert(roots.end(), snapshots.begin(), snapshots.end());
  }
  return roots;
}

std::string c4_help(const std::string& path, const std::string& split,
                    const CorpusSettings& settings) {
  return "HINT: put allenai/c4's en/c4-" + split + ".*.json.gz files (any subset of the shards) " +
         "in " + path + "/en, e.g. `huggingface-cli download allenai/c4 --repo-type dataset " +
         "--include 'en/c4-" + split + ".0000*' --local-dir " + path + "`, or set " +
         settings.path + " to the folder that holds en/ (a Hugging Face hub cache folder works)";
}

std::shared_ptr<const DocumentSource> open_c4(const std::string& path, const std::string& split,
                                              const std::string& text_field,
                                              const CorpusSettings& settings) {
  return open_text_corpus(find_c4_files(path, split, settings), text_field, settings);
}

// TorchTitan's c4_test folder (data.json, JSON lines), or any folder or file of JSON lines.
std::shared_ptr<const DocumentSource> open_c4_test(const std::string& path,
                                                   const std::string& text_field,
                                                   const CorpusSettings& settings) {
  if (!fs::exists(path)) {
    throw DataError(message("c4_test: ", path,
                            " does not exist. HINT: copy TorchTitan's tests/assets/c4_test folder "
                            "(data.json: JSON lines of c4 rows) there, or set ",
                            settings.path, " to it"));
  }
  return open_corpus(path, CorpusFormat::kJsonl, text_field, settings);
}

}  // namespace

std::vector<std::string> find_c4_files(const std::string& path, const std::string& split,
                                       const CorpusSettings& settings) {
  if (path.empty() || !fs::exists(path)) {
    throw DataError(message("c4 (", split, " split): the folder ", path, " does not exist. ",
                            c4_help(path, split, settings)));
  }
  const std::regex shard("c4-" + split + R"(\.[0-9]{5}-of-[0-9]{5}\.json\.gz)");
  for (const fs::path& root : c4_roots(path)) {
    for (const fs::path& dir : {root / "en", root}) {
      std::vector<std::string> files;
      std::error_code ec;
      for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (std::regex_match(name, shard) && it->is_regular_file()) {
          files.push_back(it->path().string());
        }
      }
      if (!files.empty()) {
        std::sort(files.begin(), files.end());
        return files;
      }
    }
  }
  throw DataError(message("c4 (", split, " split): no en/c4-", split,
                          ".NNNNN-of-NNNNN.json.gz files under ", path, ". ",
                          c4_help(path, split, settings)));
}

std::vector<DatasetSpec> c4_dataset_specs() {
  std::vector<DatasetSpec> specs;
  for (const auto& [name, split] : std::vector<std::pair<std::string, std::string>>{
           {"c4", "train"}, {"c4_validation", "validation"}}) {
    DatasetSpec spec;
    spec.name = name;
    spec.description = "allenai/c4 English, " + split + " split (en/c4-" + split +
                       ".*.json.gz files at dataset_path)";
    spec.cache_subdir = "c4";
    spec.open = [split = split](const std::string& path, const std::string& text_field,
                                const CorpusSettings& settings) {
      return open_c4(path, split, text_field, settings);
    };
    specs.push_back(std::move(spec));
  }
  DatasetSpec test;
  test.name = "c4_test";
  test.description = "TorchTitan's c4 test set (tests/assets/c4_test: data.json, JSON lines)";
  test.cache_subdir = "c4_test";
  test.open = open_c4_test;
  specs.push_back(std::move(test));
  return specs;
}

}  // namespace titan
