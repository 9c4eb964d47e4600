// TorchTitan's c4 datasets (torchtitan/datasets/hf_datasets.py), read from local files:
//   c4             allenai/c4's English train split: en/c4-train.NNNNN-of-01024.json.gz;
//   c4_validation  its validation split: en/c4-validation.NNNNN-of-00008.json.gz;
//   c4_test        TorchTitan's small test set (tests/assets/c4_test in its repository: JSON
//                  lines of c4 rows in data.json, read whole as the train split).
// Each document is a row's "text" (dataset_text_field), as TorchTitan's _process_c4_text.
//
// Where the files are (dataset_path, else titan_cache_dir()/datasets/c4 or .../c4_test):
//   - the folder holding en/ (a plain copy of the dataset repository), or en/ itself;
//   - a Hugging Face hub cache: the cache folder (…/hub), datasets--allenai--c4, or one of its
//     snapshots/<revision> folders (files there are links into blobs/, which is fine).
// Any subset of the shards works; missing shards are simply not read.
#pragma once

#include "titan/components/data/dataset.h"

#include <string>
#include <vector>

namespace titan {

// The c4 shard files of `split` ("train" or "validation") under `path`, sorted; DataError saying
// where to put them (and which key names the folder) when there are none.
std::vector<std::string> find_c4_files(const std::string& path, const std::string& split,
                                       const CorpusSettings& settings);

// Registry entries for c4, c4_validation (cache folder datasets/c4) and c4_test
// (datasets/c4_test).
std::vector<DatasetSpec> c4_dataset_specs();

}  // namespace titan
