// `titan data`: corpus tools. `titan data prepare` pre-tokenizes text (.txt, .jsonl, .json) into
// sharded token files that `--training.dataset tokens --training.dataset_path DIR` streams back.
#include "commands.h"

#include "titan/common/check.h"
#include "titan/common/format.h"
#include "titan/components/data/prepare.h"
#include "titan/components/tokenizer/tokenizer.h"

#include <cstdio>
#include <string>
#include <vector>

namespace titan {

namespace {

void print_data_usage() {
  std::printf(
      "usage: titan data prepare --input PATH [PATH ...] --output DIR [--tokenizer PATH]\n"
      "                          [--shard-tokens N] [--text-field KEY]\n"
      "\n"
      "Pre-tokenizes a corpus into token files DIR/shard_00000.bin, ... for\n"
      "  titan train --training.dataset tokens --training.dataset_path DIR\n"
      "\n"
      "  --input PATH       .txt file (one document), .jsonl/.json file (one document per line)\n"
      "                     or a folder of them, searched recursively in sorted order; repeatable\n"
      "  --output DIR       folder for the shards (created; must not already hold shards)\n"
      "  --tokenizer PATH   tokenizer files, as model.hf_assets_path; empty = byte tokenizer\n"
      "  --shard-tokens N   start a new shard past N tokens (default 100000000)\n"
      "  --text-field KEY   JSON key of a line's text (default \"text\")\n"
      "\n"
      "Token file format (little-endian): magic \"TITANTOK\", uint32 version 1, uint32 token\n"
      "width (2 or 4 bytes), uint64 vocab_size, uint64 num_tokens, uint64 num_documents, the\n"
      "token ids (without BOS/EOS), then num_documents + 1 uint64 document offsets in tokens.\n"
      "\n"
      "Training datasets (training.dataset): sotu (built-in), or your files at\n"
      "training.dataset_path: text, jsonl (key: training.dataset_text_field), tokens, auto.\n");
}

int run_prepare(const std::vector<std::string>& args) {
  PrepareOptions options;
  std::string tokenizer_path;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0) {
        throw ConfigError("data prepare: " + flag + " needs a value");
      }
      return args[++i];
    };
    if (flag == "--input") {
      options.inputs.push_back(value());
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
        options.inputs.push_back(args[++i]);
      }
    } else if (flag == "--output") {
      options.output_dir = value();
    } else if (flag == "--tokenizer") {
      tokenizer_path = value();
    } else if (flag == "--text-field") {
      options.text_field = value();
    } else if (flag == "--shard-tokens") {
      const std::string text = value();
      const std::optional<int64_t> n = parse_int64(text);
      if (!n) {
        throw ConfigError("data prepare: --shard-tokens expects an integer, got '" + text + "'");
      }
      options.shard_tokens = *n;
    } else {
      throw ConfigError("data prepare: unknown argument '" + flag +
                        "'; expected --input, --output, --tokenizer, --shard-tokens or "
                        "--text-field (see `titan data --help`)");
    }
  }
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
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    print_data_usage();
    return args.empty() ? 2 : 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "prepare") {
    for (const std::string& a : rest) {
      if (a == "--help" || a == "-h") {
        print_data_usage();
        return 0;
      }
    }
    return run_prepare(rest);
  }
  throw ConfigError("data: unknown subcommand '" + args[0] +
                    "'; expected `prepare` (see "
                    "`titan data --help`)");
}

}  // namespace titan
