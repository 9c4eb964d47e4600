// `titan data`: corpus tools. `titan data prepare` pre-tokenizes text (.txt, .jsonl, .json) into
// sharded token files that `--training.dataset tokens --training.dataset_path DIR` streams back.
#include "commands.h"
#include "flags.h"

#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/components/data/prepare.h"
#include "titan/components/tokenizer/tokenizer.h"

#include <cstdio>
#include <string>
#include <vector>

namespace titan {

namespace {

FlagTable prepare_flags(PrepareOptions& options, std::string& tokenizer_path) {
  FlagTable flags(
      "titan data prepare --input PATH [PATH ...] --output DIR [--tokenizer PATH]\n"
      "                          [--shard-tokens N] [--text-field KEY]",
      "Pre-tokenizes a corpus into token files DIR/shard_00000.bin, ... for\n"
      "  titan train --training.dataset tokens --training.dataset_path DIR");
  flags
      .values("--input", "PATH",
              ".txt file (one document), .jsonl/.json file (one document per line)\n"
              "or a folder of them, searched recursively in sorted order; repeatable",
              [&options](const std::string& v) { options.inputs.push_back(v); })
      .value("--output", "DIR", "folder for the shards (created; must not already hold shards)",
             [&options](const std::string& v) { options.output_dir = v; })
      .value("--tokenizer", "PATH",
             "tokenizer files, as model.hf_assets_path; empty = byte tokenizer",
             [&tokenizer_path](const std::string& v) { tokenizer_path = v; })
      .value("--shard-tokens", "N", "start a new shard past N tokens (default 100000000)",
             [&options](const std::string& v) {
               const std::optional<int64_t> n = parse_int64(v);
               TITAN_CONFIG_CHECK(n, "data prepare: --shard-tokens expects an integer, got '", v,
                                  "'");
               options.shard_tokens = *n;
             })
      .value("--text-field", "KEY", "JSON key of a line's text (default \"text\")",
             [&options](const std::string& v) { options.text_field = v; })
      .epilogue(
          "Token file format (little-endian): magic \"TITANTOK\", uint32 version 1, uint32 token\n"
          "width (2 or 4 bytes), uint64 vocab_size, uint64 num_tokens, uint64 num_documents, the\n"
          "token ids (without BOS/EOS), then num_documents + 1 uint64 document offsets in tokens.\n"
          "\n"
          "Training datasets (training.dataset): sotu (built-in), or your files at\n"
          "training.dataset_path: text, jsonl (key: training.dataset_text_field), tokens, auto.");
  return flags;
}

int run_prepare(const std::vector<std::string>& args) {
  PrepareOptions options;
  std::string tokenizer_path;
  prepare_flags(options, tokenizer_path).parse_exact(args);
  const std::unique_ptr<Tokenizer> tokenizer = build_tokenizer(tokenizer_path);
  const auto rate = [](const PrepareStats& s) {
    return s.seconds > 0 ? static_cast<int64_t>(s.tokens / s.seconds) : 0;
  };
  const PrepareStats stats = prepare_token_shards(options, *tokenizer, [&](const PrepareStats& s) {
    std::printf("data prepare: %s documents, %s tokens, %s tokens/s, %lld shard(s)\n",
                with_commas(s.documents).c_str(), with_commas(s.tokens).c_str(),
                human_count(rate(s)).c_str(), static_cast<long long>(s.shards));
    std::fflush(stdout);
  });
  std::printf(
      "data prepare: done: %s documents, %s tokens (vocab %lld) in %lld shard(s) under %s; "
      "%.2fs, %s tokens/s\n",
      with_commas(stats.documents).c_str(), with_commas(stats.tokens).c_str(),
      static_cast<long long>(tokenizer->vocab_size()), static_cast<long long>(stats.shards),
      options.output_dir.c_str(), stats.seconds, human_count(rate(stats)).c_str());
  return 0;
}

}  // namespace

int run_data(const std::vector<std::string>& args) {
  PrepareOptions unused_options;
  std::string unused_path;
  const std::vector<FlagTable> actions = {prepare_flags(unused_options, unused_path)};
  if (FlagTable::wants_help(args)) {
    std::fputs(actions_usage(actions).c_str(), stdout);
    return 0;
  }
  choose_action(args, actions);
  return run_prepare(std::vector<std::string>(args.begin() + 1, args.end()));
}

}  // namespace titan
