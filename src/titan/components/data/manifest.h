// Verification of a dataset folder against a manifest (file name, size, FNV-1a 64 hash) that is
// compiled into the binary, so a truncated download or an edited cache file is caught when read.
#pragma once

#include "titan/components/data/dataset.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace titan {

struct ManifestEntry {
  std::string_view filename;  // relative to the dataset folder
  int64_t size;               // bytes
  uint64_t fnv1a64;           // hash of the contents
};

// FNV-1a, 64-bit: offset basis 0xcbf29ce484222325, prime 0x100000001b3.
uint64_t fnv1a64(std::string_view data);

// Reads the files of `entries` from folder `dir`, in order, into documents named by file name.
// Every file is checked against its entry; `dataset` names the dataset in messages and
// `setup_command` is what the user runs to (re)fetch it. Throws DataError when the folder is
// missing ("dataset 'sotu' not found at DIR; run scripts/setup.sh to fetch it") or a file is
// missing, has the wrong size or the wrong hash.
std::vector<Document> read_verified_documents(const std::string& dataset, const std::string& dir,
                                              const std::vector<ManifestEntry>& entries,
                                              const std::string& setup_command);

}  // namespace titan
