// `titan generate`: continue a prompt with a trained model (a titan checkpoint or a Hugging Face
// folder), streaming the text to stdout as it is produced. stdout carries only the text (or,
// with --print_ids, one line of ids) so that scripts can compare runs; the model description,
// notes and tokens/s go to stderr. Bad usage throws ConfigError (exit 2).
#include "commands.h"
#include "flags.h"

#include "titan/checkpoint/model_loader.h"
#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/common/device.h"
#include "titan/common/format.h"
#include "titan/components/tokenizer/tokenizer.h"
#include "titan/components/tokenizer/tokenizer_identity.h"
#include "titan/inference/generator.h"
#include "titan/inference/text_stream.h"
#include "titan/models/registry.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <sstream>

namespace titan {
namespace {

struct GenerateOptions {
  std::string checkpoint;
  std::string flavor;
  std::optional<std::string> prompt;
  std::optional<std::string> prompt_ids;
  std::optional<std::string> tokenizer;
  std::string dtype = "float32";
  std::string device = "auto";
  int64_t max_seq_len = 2048;
  int64_t threads = 0;
  bool print_ids = false;
  bool no_kv_cache = false;
  GenerationOptions generation;
};

int64_t parse_int(const std::string& name, const std::string& text) {
  const std::optional<int64_t> value = parse_int64(text);
  if (!value) throw ConfigError(message(name, " expects an integer, got '", text, "'"));
  return *value;
}

double parse_double(const std::string& name, const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) {
    throw ConfigError(message(name, " expects a number, got '", text, "'"));
  }
  return value;
}

// The flags, writing into `opts`.
FlagTable generate_flags(GenerateOptions& opts) {
  SamplerOptions& sampler = opts.generation.sampler;
  const auto text = [](std::string& field) {
    return [&field](const std::string& v) { field = v; };
  };
  const auto optional_text = [](std::optional<std::string>& field) {
    return [&field](const std::string& v) { field = v; };
  };
  FlagTable flags(
      "titan generate --checkpoint PATH (--prompt TEXT | --prompt_ids \"ID ...\") [options]", "");
  flags
      .value("--checkpoint", "PATH",
             "a titan checkpoint (a step-N folder, or the checkpoint folder: its\n"
             "latest complete step) or a Hugging Face model folder",
             text(opts.checkpoint))
      .value("--prompt", "TEXT", "text to continue; encoded with the tokenizer after a BOS token",
             optional_text(opts.prompt))
      .value("--prompt_ids", "\"ID ...\"", "token ids to continue, used as given (no BOS added)",
             optional_text(opts.prompt_ids))
      .value("--max_new_tokens", "N",
             "tokens to generate at most (default 128); generation also stops\n"
             "at the tokenizer's EOS token and at --max_seq_len",
             [&opts](const std::string& v) {
               opts.generation.max_new_tokens = parse_int("--max_new_tokens", v);
             })
      .value("--temperature", "T", "softmax temperature; 0 = greedy (default 1.0)",
             [&sampler](const std::string& v) {
               sampler.temperature = parse_double("--temperature", v);
             })
      .value("--top_k", "K", "sample among the K most likely tokens; 0 = all (default 0)",
             [&sampler](const std::string& v) { sampler.top_k = parse_int("--top_k", v); })
      .value("--top_p", "P",
             "sample among the fewest most likely tokens whose probability sums\n"
             "to P; 1 = all (default 1.0)",
             [&sampler](const std::string& v) { sampler.top_p = parse_double("--top_p", v); })
      .value("--seed", "S", "sampling seed (default 0): the same seed gives the same tokens",
             [&sampler](const std::string& v) {
               const int64_t seed = parse_int("--seed", v);
               TITAN_CONFIG_CHECK(seed >= 0, "--seed must be >= 0, got ", seed);
               sampler.seed = static_cast<uint64_t>(seed);
             })
      .value("--tokenizer", "PATH",
             "tokenizer files (default: the checkpoint's; \"\" = byte tokenizer)",
             optional_text(opts.tokenizer))
      .value("--dtype", "float32|bfloat16", "compute dtype (default float32)", text(opts.dtype))
      .value("--max_seq_len", "N", "longest sequence, prompt included (default 2048)",
             [&opts](const std::string& v) { opts.max_seq_len = parse_int("--max_seq_len", v); })
      .value("--threads", "N", "CPU threads; 0 = one per core (default 0)",
             [&opts](const std::string& v) {
               opts.threads = parse_int("--threads", v);
               TITAN_CONFIG_CHECK(opts.threads >= 0 && opts.threads <= kMaxNumThreads, "--threads ",
                                  v, " must be in [0, ", kMaxNumThreads,
                                  "] (0 = one per core; more would stall start-up)");
             })
      .value("--device", "D",
             "auto (the first visible CUDA device, else the CPU), cuda or cpu\n"
             "(default auto; training.device's rule for one process)",
             text(opts.device))
      .toggle("--print_ids",
              "print the whole sequence (prompt and generated) as one line of\n"
              "space-separated ids instead of streaming text",
              &opts.print_ids)
      .toggle("--no_kv_cache",
              "re-run the whole sequence every step instead of using the KV\n"
              "cache (slow; for checking the cache: greedy output is the same)",
              &opts.no_kv_cache)
      .value("--flavor", "NAME",
             "instead of --checkpoint: a randomly initialized llama3 of this\n"
             "flavor, seeded by --seed (timing and smoke tests)",
             text(opts.flavor))
      .epilogue("Text (or the ids) goes to stdout; the model, notes and tokens/s go to stderr.");
  return flags;
}

GenerateOptions parse_generate_options(const std::vector<std::string>& args) {
  GenerateOptions opts;
  const FlagTable flags = generate_flags(opts);
  const std::string usage = flags.usage();
  for (const std::string& extra : flags.parse(args)) {
    throw ConfigError(message("unknown argument '", extra, "'\n", usage));
  }
  if (opts.no_kv_cache) opts.generation.use_kv_cache = false;
  if (opts.checkpoint.empty() == opts.flavor.empty()) {
    throw ConfigError(
        message(std::string(opts.checkpoint.empty() ? "--checkpoint is required"
                                                    : "--checkpoint and --flavor exclude "
                                                      "each other"),
                "\n", usage));
  }
  if (opts.prompt.has_value() == opts.prompt_ids.has_value()) {
    throw ConfigError(message("give exactly one of --prompt and --prompt_ids\n", usage));
  }
  if (opts.dtype != "float32" && opts.dtype != "bfloat16") {
    throw ConfigError(message("--dtype must be float32 or bfloat16, got '", opts.dtype, "'"));
  }
  if (opts.max_seq_len < 2) {
    throw ConfigError(message("--max_seq_len must be >= 2, got ", opts.max_seq_len));
  }
  if (opts.generation.max_new_tokens < 0) {
    throw ConfigError(
        message("--max_new_tokens must be >= 0, got ", opts.generation.max_new_tokens));
  }
  if (!opts.checkpoint.empty() && !std::filesystem::exists(opts.checkpoint)) {
    throw ConfigError(
        message("--checkpoint ", opts.checkpoint,
                ": no such file or directory. HINT: pass a checkpoint folder written by "
                "`titan train --checkpoint.enable` (or one of its step-N folders), or a "
                "Hugging Face model folder"));
  }
  opts.generation.max_seq_len = opts.max_seq_len;
  Sampler check_sampler_options(opts.generation.sampler);  // bad sampling options, before loading
  return opts;
}

// "1 2 3" -> {1, 2, 3}; each id must be in [0, vocab_size).
std::vector<int64_t> parse_prompt_ids(const std::string& text, int64_t vocab_size) {
  std::vector<int64_t> ids;
  std::istringstream fields(text);
  std::string field;
  while (fields >> field) {
    const int64_t id = parse_int("--prompt_ids", field);
    if (id < 0 || id >= vocab_size) {
      throw ConfigError(message("--prompt_ids: id ", field,
                                " is outside the tokenizer's vocabulary [0, ", vocab_size,
                                "). HINT: --tokenizer PATH selects the model's tokenizer"));
    }
    ids.push_back(id);
  }
  if (ids.empty()) throw ConfigError("--prompt_ids has no ids");
  return ids;
}

// Streams to stdout; a failed write (a full disk, a closed pipe) ends the command with the errno.
void write_out(const std::string& text) {
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0) {
    throw DataError(std::string("generate: cannot write the output to standard output: ") +
                    std::strerror(errno) +
                    ". HINT: check where standard output goes (a full disk?)");
  }
}

}  // namespace

int run_generate(const std::vector<std::string>& args) {
  if (std::any_of(args.begin(), args.end(),
                  [](const std::string& a) { return a == "--help" || a == "-h"; })) {
    GenerateOptions unused;
    std::fputs(generate_flags(unused).usage().c_str(), stdout);
    return 0;
  }
  GenerateOptions opts = parse_generate_options(args);
  const std::string threads = configure_threads(opts.threads);
  const at::ScalarType dtype = opts.dtype == "bfloat16" ? at::kBFloat16 : at::kFloat;

  std::shared_ptr<Model> model;
  std::string description;
  std::string tokenizer_path;
  if (!opts.checkpoint.empty()) {
    ckpt::LoadedModel loaded = ckpt::load_model(opts.checkpoint, dtype, opts.max_seq_len);
    model = loaded.model;
    description = loaded.model_name + " " + loaded.flavor + " from " + loaded.source;
    tokenizer_path = loaded.tokenizer_path;
  } else {
    const ModelSpec& spec = get_model_spec("llama3");
    check_flavor(spec, opts.flavor);
    ModelBuildOptions build;
    build.max_seq_len = opts.max_seq_len;
    build.compute_dtype = dtype;
    at::manual_seed(opts.generation.sampler.seed);
    model = spec.build(opts.flavor, build);
    description = "llama3 " + opts.flavor + " (random init)";
  }
  cast_parameters_for_inference(*model, dtype);
  const at::Device device =
      select_device(opts.device, /*local_rank=*/0, /*local_world_size=*/1, "--device");
  if (!device.is_cpu()) model->to(device);  // parameters and buffers (RoPE tables)
  // After the cast and the move: packing makes the projections views of one matrix each.
  const InferencePreparation prepared = prepare_for_inference(*model);
  const std::string model_tokenizer_path = tokenizer_path;
  if (opts.tokenizer) tokenizer_path = *opts.tokenizer;
  const std::unique_ptr<Tokenizer> tokenizer = build_tokenizer(tokenizer_path);
  // As `titan train` checks: ids past the model's embedding would index out of range.
  check_tokenizer_fits_model(
      *tokenizer, model->stats(1, opts.max_seq_len).vocab_size, description,
      opts.checkpoint.empty()
          ? "pick a --flavor with a larger vocab, or another --tokenizer"
          : "use the model's own tokenizer: drop --tokenizer to use " +
                (model_tokenizer_path.empty() ? std::string("the byte tokenizer")
                                              : "'" + model_tokenizer_path + "'") +
                " (recorded with the model)");

  std::vector<int64_t> prompt;
  if (opts.prompt_ids) {
    prompt = parse_prompt_ids(*opts.prompt_ids, tokenizer->vocab_size());
  } else {
    // Training documents start with BOS (the data loader adds it), so prompts do too.
    const int64_t bos = bos_id_or_none(*tokenizer);
    if (bos >= 0) prompt.push_back(bos);
    const std::vector<int64_t> text_ids = tokenizer->encode(*opts.prompt);
    prompt.insert(prompt.end(), text_ids.begin(), text_ids.end());
  }
  opts.generation.eos_id = eos_id_or_none(*tokenizer);
  opts.generation.vocab_limit = tokenizer->vocab_size();

  std::fprintf(stderr,
               "generate: %s on %s, %s compute, %s, KV cache %s, %zu prompt tokens, %lld packed "
               "projection groups\n",
               description.c_str(), device.str().c_str(), opts.dtype.c_str(), threads.c_str(),
               opts.generation.use_kv_cache ? "on" : "off", prompt.size(),
               static_cast<long long>(prepared.packed));
  TextStream stream(*tokenizer);
  std::function<void(int64_t)> on_token;
  if (!opts.print_ids) {
    write_out(opts.prompt ? *opts.prompt : tokenizer->decode(prompt));
    on_token = [&](int64_t id) { write_out(stream.put(id)); };
  }
  const GenerationResult result = generate(*model, prompt, opts.generation, on_token);
  if (opts.print_ids) {
    write_out(join(result.tokens, " ") + "\n");
  } else {
    write_out(stream.flush() + "\n");
  }
  if (result.stop_reason == StopReason::kMaxSeqLen) {
    std::fprintf(stderr,
                 "note: stopped after %lld new tokens: the sequence reached --max_seq_len %lld. "
                 "HINT: raise --max_seq_len\n",
                 static_cast<long long>(result.n_generated),
                 static_cast<long long>(opts.max_seq_len));
  }
  std::fprintf(stderr,
               "generated %lld tokens (stop: %s) | prefill %lld tokens %.3f s (%.1f tokens/s) | "
               "decode %.1f tokens/s\n",
               static_cast<long long>(result.n_generated), to_string(result.stop_reason),
               static_cast<long long>(result.n_prompt), result.prefill_seconds,
               result.prefill_tokens_per_second(), result.decode_tokens_per_second());
  return 0;
}

}  // namespace titan
