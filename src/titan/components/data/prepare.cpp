// `titan data prepare`: text corpus -> sharded token files; see prepare.h.
#include "titan/components/data/prepare.h"

#include "titan/common/check.h"
#include "titan/components/data/document_source.h"
#include "titan/components/data/token_file.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

namespace titan {

namespace fs = std::filesystem;

std::string token_shard_name(int64_t index) {
  char name[32];
  std::snprintf(name, sizeof(name), "shard_%05lld.bin", static_cast<long long>(index));
  return name;
}

PrepareStats prepare_token_shards(const PrepareOptions& options, const Tokenizer& tokenizer,
                                  const std::function<void(const PrepareStats&)>& progress) {
  if (options.inputs.empty()) {
    throw ConfigError("data prepare: no --input given");
  }
  if (options.output_dir.empty()) {
    throw ConfigError("data prepare: no --output folder given");
  }
  if (options.shard_tokens < 1) {
    throw ConfigError(
        message("data prepare: --shard-tokens must be >= 1, got ", options.shard_tokens));
  }
  // Checked first: an output folder inside an input folder would otherwise offer its old
  // shards as input.
  if (fs::exists(fs::path(options.output_dir) / token_shard_name(0))) {
    throw DataError("data prepare: " + options.output_dir + " already holds " +
                    token_shard_name(0) +
                    ". HINT: remove the old shards or pick another "
                    "--output folder, so old and new shards do not mix");
  }
  std::vector<std::string> files;
  for (const std::string& input : options.inputs) {
    for (std::string& file :
         list_corpus_files(input, CorpusFormat::kAuto, CorpusSettings::of_prepare())) {
      if (fs::path(file).extension() == ".bin") {
        throw DataError("data prepare: " + file + " is already a token file; inputs must be " +
                        ".txt, .jsonl or .json text");
      }
      files.push_back(std::move(file));
    }
  }
  std::error_code ec;
  fs::create_directories(options.output_dir, ec);
  if (ec) {
    throw DataError("data prepare: cannot create " + options.output_dir + ": " + ec.message());
  }

  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // Parses every JSON line once up front, so a malformed corpus fails before any shard exists.
  const std::shared_ptr<const DocumentSource> source =
      open_text_corpus(files, options.text_field, CorpusSettings::of_prepare());

  PrepareStats stats;
  std::unique_ptr<TokenFileWriter> writer;
  const auto finish_shard = [&] {
    if (writer != nullptr) {
      writer->finish();
      writer.reset();
    }
  };
  double last_report = 0.0;
  for (int64_t i = 0; i < source->size(); ++i) {
    const std::vector<int64_t> ids = source->encode(i, tokenizer);
    const auto n = static_cast<int64_t>(ids.size());
    // A document never straddles shards; one longer than shard_tokens gets a shard of its own.
    if (writer != nullptr && writer->num_documents() > 0 &&
        writer->num_tokens() + n > options.shard_tokens) {
      finish_shard();
    }
    if (writer == nullptr) {
      const std::string path =
          (fs::path(options.output_dir) / token_shard_name(stats.shards)).string();
      writer = std::make_unique<TokenFileWriter>(path, tokenizer.vocab_size());
      stats.shard_paths.push_back(path);
      ++stats.shards;
    }
    writer->add_document(ids);
    ++stats.documents;
    stats.tokens += n;
    if (progress && elapsed() - last_report >= 1.0) {
      last_report = elapsed();
      stats.seconds = last_report;
      progress(stats);
    }
  }
  finish_shard();
  stats.seconds = elapsed();
  return stats;
}

}  // namespace titan
