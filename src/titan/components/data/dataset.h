// Dataset registry: a dataset is a name plus a function that reads its documents from a path.
// Callers use open_dataset(name, options) (or load_dataset for the whole text in memory); a new
// source is added with register_dataset() or to the built-in list in dataset.cpp.
//
// Built-in names: sotu, sotu_validation (the bundled corpus); TorchTitan's c4, c4_validation and
// c4_test read from local files (c4.h); and, for the user's own data at dataset_path, text (.txt
// files, one document each), jsonl (.jsonl/.json, plain or .gz/.zst, one document per line),
// parquet (.parquet, one document per row), tokens (.bin files from `titan data prepare`) and
// auto (format from the extensions).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace titan {

class DocumentSource;

// One unit of text; the data loader wraps each in BOS ... EOS.
struct Document {
  std::string name;  // where it came from, e.g. the file name
  std::string text;
};

// The settings a corpus came from, named in error hints: config keys for the trainer's
// training and validation sections, command-line flags for `titan data prepare`.
struct CorpusSettings {
  std::string path = "training.dataset_path";
  std::string format = "training.dataset";  // empty: nothing names the format (extensions do)
  std::string text_field = "training.dataset_text_field";

  // "<section>.dataset_path", "<section>.dataset", "<section>.dataset_text_field".
  static CorpusSettings of_section(const std::string& section);
  // --input, no format flag, --text-field.
  static CorpusSettings of_prepare();
};

struct DatasetSpec {
  std::string name;
  // One line for error messages and listings.
  std::string description;
  // Default location when the config leaves dataset_path empty: cache_dir()/datasets/<this>.
  // Several datasets may share one folder (splits of one corpus).
  std::string cache_subdir;
  // Reads the documents, in a fixed order, from a folder or file. Throws DataError.
  std::function<std::vector<Document>(const std::string& path)> load;
  // Alternatively, streams them: a source that reads documents on demand. `text_field` is the
  // JSON key holding the text, for sources that read JSON; `settings` name the keys in hints.
  // Used instead of `load` when set.
  std::function<std::shared_ptr<const DocumentSource>(
      const std::string& path, const std::string& text_field, const CorpusSettings& settings)>
      open;
};

// Adds a dataset (it needs `load` or `open`); throws ConfigError if the name is already taken.
void register_dataset(DatasetSpec spec);

// Names of all registered datasets, sorted.
std::vector<std::string> dataset_names();

// ${TITAN_CACHE:-$HOME/.cache/titan}, the folder scripts/setup.sh fills.
std::string titan_cache_dir();

// Where `name` lives when no path is configured: titan_cache_dir()/datasets/<cache_subdir>.
// Throws ConfigError for an unknown name.
std::string default_dataset_path(const std::string& name);

// The documents of dataset `name` read from `path` (empty: default_dataset_path(name)).
// Unknown name -> ConfigError naming the closest known one; missing or corrupt data -> DataError.
std::vector<Document> load_dataset(const std::string& name, const std::string& path);

// Dataset `name` at `path` (empty: its default location) as a source the DataLoader pulls from:
// streamed from disk for user corpora, in memory for the built-ins. Errors as load_dataset.
std::shared_ptr<const DocumentSource> open_dataset(const std::string& name, const std::string& path,
                                                   const std::string& text_field = "text",
                                                   const CorpusSettings& settings = {});

}  // namespace titan
