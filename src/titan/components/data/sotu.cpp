// The `sotu` corpus: split selection and registry entries (the manifest is in sotu_manifest.cpp).
#include "titan/components/data/sotu.h"

namespace titan {

namespace {

constexpr const char* kSetupCommand = "scripts/setup.sh";
constexpr const char* kCacheSubdir = "sotu";

}  // namespace

bool is_sotu_validation_file(std::string_view filename) {
  // File names are <year>_<president>_<party>.txt.
  return filename.size() > 4 && filename[3] == '5' && filename[4] == '_';
}

std::vector<Document> load_sotu(const std::string& dir, SotuSplit split,
                                const std::vector<ManifestEntry>& manifest) {
  const bool want_validation = split == SotuSplit::kValidation;
  std::vector<ManifestEntry> entries;
  for (const ManifestEntry& entry : manifest) {
    if (is_sotu_validation_file(entry.filename) == want_validation) {
      entries.push_back(entry);
    }
  }
  const char* name = want_validation ? "sotu_validation" : "sotu";
  return read_verified_documents(name, dir, entries, kSetupCommand);
}

std::vector<DatasetSpec> sotu_dataset_specs() {
  return {
      DatasetSpec{
          "sotu", "State of the Union addresses 1790-2021 except years ending in 5 (210 docs)",
          kCacheSubdir, [](const std::string& path) { return load_sotu(path, SotuSplit::kTrain); }},
      DatasetSpec{"sotu_validation",
                  "State of the Union addresses of years ending in 5, held out (23 docs)",
                  kCacheSubdir,
                  [](const std::string& path) { return load_sotu(path, SotuSplit::kValidation); }},
  };
}

}  // namespace titan
