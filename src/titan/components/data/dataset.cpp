// The dataset registry, seeded with the built-in corpora.
#include "titan/components/data/dataset.h"

#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/common/names.h"
#include "titan/components/data/c4.h"
#include "titan/components/data/document_source.h"
#include "titan/components/data/sotu.h"

#include <cstdlib>
#include <map>
#include <mutex>

namespace titan {

namespace {

// The user's own corpora at dataset_path, one entry per format; streamed, never in memory.
std::vector<DatasetSpec> user_corpus_specs() {
  const std::vector<std::pair<std::string, std::string>> formats{
      {"text", "your .txt files at dataset_path (one document per file)"},
      {"jsonl",
       "your .jsonl/.json files (plain, .gz or .zst) at dataset_path (one document per line)"},
      {"parquet", "your .parquet files at dataset_path (one document per row)"},
      {"tokens", "your .bin token files at dataset_path (from `titan data prepare`)"},
      {"auto", "your .txt/.jsonl/.json/.parquet/.bin files at dataset_path, format by extension"},
  };
  std::vector<DatasetSpec> specs;
  for (const auto& [name, description] : formats) {
    const CorpusFormat format = corpus_format_from_name(name);
    DatasetSpec spec;
    spec.name = name;
    spec.description = description;
    spec.open = [format](const std::string& path, const std::string& text_field,
                         const CorpusSettings& settings) {
      return open_corpus(path, format, text_field, settings);
    };
    specs.push_back(std::move(spec));
  }
  return specs;
}

struct Registry {
  std::mutex mutex;
  std::map<std::string, DatasetSpec> specs;
};

// Built-ins are added here rather than by static initializers, which a static library drops.
Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    for (DatasetSpec& spec : sotu_dataset_specs()) {
      reg->specs.emplace(spec.name, std::move(spec));
    }
    for (DatasetSpec& spec : c4_dataset_specs()) {
      reg->specs.emplace(spec.name, std::move(spec));
    }
    for (DatasetSpec& spec : user_corpus_specs()) {
      reg->specs.emplace(spec.name, std::move(spec));
    }
    return reg;
  }();
  return *r;
}

DatasetSpec find_spec(const std::string& name) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto it = reg.specs.find(name);
  if (it != reg.specs.end()) {
    return it->second;
  }
  std::vector<std::string> known;
  for (const auto& entry : reg.specs) known.push_back(entry.first);
  throw ConfigError(message("unknown dataset '", name, "'", did_you_mean(likely_name(name, known)),
                            " Known datasets: ", join(known), "."));
}

}  // namespace

void register_dataset(DatasetSpec spec) {
  TITAN_CHECK(!spec.name.empty() && (spec.load || spec.open),
              "register_dataset: a dataset needs a name and a load or open function");
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  const std::string name = spec.name;
  if (!reg.specs.emplace(name, std::move(spec)).second) {
    throw ConfigError(message("register_dataset: dataset '", name, "' is already registered"));
  }
}

std::vector<std::string> dataset_names() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  std::vector<std::string> names;
  for (const auto& entry : reg.specs) {
    names.push_back(entry.first);
  }
  return names;
}

std::string titan_cache_dir() {
  // Same rule as the scripts' ${TITAN_CACHE:-$HOME/.cache/titan}: empty counts as unset.
  const char* cache = std::getenv("TITAN_CACHE");
  if (cache != nullptr && *cache != '\0') {
    return cache;
  }
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home == '\0') {
    throw ConfigError(
        "cannot locate the titan cache: neither TITAN_CACHE nor HOME is set. HINT: set "
        "TITAN_CACHE, or give training.dataset_path explicitly");
  }
  return std::string(home) + "/.cache/titan";
}

std::string default_dataset_path(const std::string& name) {
  const DatasetSpec spec = find_spec(name);
  if (spec.cache_subdir.empty()) {
    throw ConfigError(
        message("dataset '", name,
                "' reads your own files and has no default location; "
                "set the dataset_path of its section (e.g. --training.dataset_path DIR or "
                "--validation.dataset_path DIR)"));
  }
  return titan_cache_dir() + "/datasets/" + spec.cache_subdir;
}

std::vector<Document> load_dataset(const std::string& name, const std::string& path) {
  const DatasetSpec spec = find_spec(name);
  const std::string where = path.empty() ? default_dataset_path(name) : path;
  if (spec.load) {
    return spec.load(where);
  }
  const std::shared_ptr<const DocumentSource> source = spec.open(where, "text", CorpusSettings{});
  std::vector<Document> docs;
  for (int64_t i = 0; i < source->size(); ++i) {
    docs.push_back(Document{source->describe(i), source->text(i)});
  }
  return docs;
}

std::shared_ptr<const DocumentSource> open_dataset(const std::string& name, const std::string& path,
                                                   const std::string& text_field,
                                                   const CorpusSettings& settings) {
  const DatasetSpec spec = find_spec(name);
  const std::string where = path.empty() ? default_dataset_path(name) : path;
  if (spec.open) {
    return spec.open(where, text_field, settings);
  }
  return std::make_shared<MemoryDocumentSource>(
      std::make_shared<const std::vector<Document>>(spec.load(where)));
}

}  // namespace titan
