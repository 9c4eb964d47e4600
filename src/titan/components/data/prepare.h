// Offline pre-tokenization (`titan data prepare`): reads a text corpus (.txt, .jsonl, .json),
// tokenizes every document once and writes sharded token files (token_file.h) that the `tokens`
// dataset streams back memory-mapped. Documents are read one at a time, so memory is one
// document plus one shard's document offsets.
#pragma once

#include "titan/components/tokenizer/tokenizer.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace titan {

struct PrepareOptions {
  std::vector<std::string> inputs;     // files or folders (searched recursively), in this order
  std::string output_dir;              // created if missing; must not already hold shard files
  std::string text_field = "text";     // JSON key of a line's text
  int64_t shard_tokens = 100'000'000;  // a new shard starts once one would exceed this
};

struct PrepareStats {
  int64_t documents = 0;
  int64_t tokens = 0;
  int64_t shards = 0;  // finished and in progress
  double seconds = 0.0;
  std::vector<std::string> shard_paths;  // written so far
};

// File name of shard `index`: shard_00000.bin, shard_00001.bin, ...
std::string token_shard_name(int64_t index);

// Tokenizes `options.inputs` with `tokenizer` into options.output_dir. `progress` (optional) is
// called about once a second while it runs. Throws DataError for unreadable or malformed input
// (naming file and line) and ConfigError for bad options.
PrepareStats prepare_token_shards(
    const PrepareOptions& options, const Tokenizer& tokenizer,
    const std::function<void(const PrepareStats&)>& progress = nullptr);

}  // namespace titan
