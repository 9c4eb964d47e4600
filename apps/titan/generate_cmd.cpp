// `titan generate`: continue a prompt with a trained model (a titan checkpoint or a Hugging Face
// folder), streaming the text to stdout as it is produced; or, for an image model (FLUX), draw an
// image for the prompt and write it as a PNG (--output); a vision-language model continues a
// prompt that follows an image (--image). stdout carries only the text (or,
// with --print_ids, one line of ids) so that scripts can compare runs; the model description,
// notes and tokens/s go to stderr. Bad usage throws ConfigError (exit 2).
#include "commands.h"
#include "flags.h"

#include "titan/checkpoint/model_loader.h"
#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/common/device.h"
#include "titan/common/file_io.h"
#include "titan/common/format.h"
#include "titan/components/data/image.h"
#include "titan/components/data/image_batches.h"
#include "titan/components/data/image_text_batches.h"
#include "titan/components/tokenizer/tokenizer.h"
#include "titan/components/tokenizer/tokenizer_identity.h"
#include "titan/config/config_manager.h"
#include "titan/inference/generator.h"
#include "titan/inference/text_stream.h"
#include "titan/models/flux/model.h"
#include "titan/models/flux/sampling.h"
#include "titan/models/registry.h"
#include "titan/models/vlm/model.h"
#include "titan/trainer/flux_setup.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <sstream>

namespace titan {
namespace {

struct GenerateOptions {
  std::string checkpoint;
  std::string flavor;
  std::optional<std::string> prompt;
  std::optional<std::string> prompt_ids;
  std::optional<std::string> image;  // a vision-language model's image before the prompt
  std::optional<std::string> tokenizer;
  std::string dtype = "float32";
  std::string device = "auto";
  int64_t max_seq_len = 2048;
  int64_t threads = 0;
  bool print_ids = false;
  bool no_kv_cache = false;
  std::string model_name = "llama3";  // the model --flavor builds
  GenerationOptions generation;
  // Image models:
  std::string output;
  int64_t steps = 50;
  double guidance_scale = 1.0;
  double guidance = 3.5;
  int64_t img_size = 0;  // 0: the training run's training.img_size (256 without a checkpoint)
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
             "latest complete step), a Hugging Face model folder, or a diffusers\n"
             "FluxPipeline folder (FLUX.1-dev, FLUX.1-schnell)",
             text(opts.checkpoint))
      .value("--prompt", "TEXT", "text to continue; encoded with the tokenizer after a BOS token",
             optional_text(opts.prompt))
      .value("--image", "PATH",
             "a vision-language model (vlm): a PNG or JPEG image the prompt\n"
             "follows, as in training (BOS, the image's patches, then --prompt)",
             optional_text(opts.image))
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
             "instead of --checkpoint: a randomly initialized model of this\n"
             "flavor, seeded by --seed (timing and smoke tests)",
             text(opts.flavor))
      .value("--model.name", "NAME", "the model --flavor builds (default llama3)",
             text(opts.model_name))
      .value("--output", "PATH", "image models (flux): where the PNG goes (written atomically)",
             text(opts.output))
      .value("--steps", "N", "image models: Euler denoising steps (default 50)",
             [&opts](const std::string& v) { opts.steps = parse_int("--steps", v); })
      .value("--guidance_scale", "S",
             "image models: classifier-free guidance scale; > 1 adds an\n"
             "unconditional prediction per step (default 1: off)",
             [&opts](const std::string& v) {
               opts.guidance_scale = parse_double("--guidance_scale", v);
             })
      .value("--guidance", "G",
             "image models with a guidance embedding (flux-dev): its strength\n"
             "(default 3.5)",
             [&opts](const std::string& v) { opts.guidance = parse_double("--guidance", v); })
      .value("--img_size", "N",
             "image models: the image side, a multiple of 16 (default: the\n"
             "training run's training.img_size)",
             [&opts](const std::string& v) { opts.img_size = parse_int("--img_size", v); })
      .epilogue(
          "Text (or the ids) goes to stdout; the model, notes and tokens/s go to stderr.\n"
          "Image models write the PNG to --output and report to stderr.");
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

// The job config a checkpoint recorded (its encoders, image size, tokens per caption), or, for a
// randomly initialized model, the defaults with training.test_mode (random encoders).
JobConfig recorded_job_config(const std::string& toml, const std::string& source) {
  if (toml.empty()) {
    JobConfig config;
    config.training.test_mode = true;
    return config;
  }
  return parse_job_config_toml(toml, source + " (the run's recorded job config)");
}

// An image for --prompt from a FLUX transformer, written to --output as a PNG.
// `shift`: the shifted schedule (all but flux-schnell).
int generate_image(const GenerateOptions& opts, Model& model, const std::string& description,
                   const std::string& tokenizer_path, const JobConfig& config,
                   const std::string& flavor, bool shift, const at::Device& device) {
  TITAN_CONFIG_CHECK(!opts.output.empty(), "an image model writes a PNG: give --output PATH");
  TITAN_CONFIG_CHECK(opts.prompt.has_value(),
                     "an image model takes --prompt TEXT (a caption), "
                     "not --prompt_ids");
  auto* flux_model = dynamic_cast<flux::FluxTransformer*>(&model);
  TITAN_CHECK(flux_model != nullptr, "generate: ", description, " is not a FLUX transformer");
  const std::unique_ptr<Tokenizer> tokenizer =
      build_tokenizer(opts.tokenizer ? *opts.tokenizer : tokenizer_path);
  const std::unique_ptr<FluxTokenizers> tokenizers = build_flux_tokenizers(config, *tokenizer);
  const flux::FluxEncoders encoders =
      load_flux_encoders(config, flavor, flux_model->args(), *tokenizers, device);
  const int64_t t5_len = config.encoder.max_t5_encoding_len, clip_len = 77;
  const CaptionTokenizers& captions = tokenizers->captions;
  const auto t5_ids = [&](const std::string& text) {
    return at::tensor(captions.t5_ids(text, t5_len), at::kLong).view({1, t5_len});
  };
  const auto clip_ids = [&](const std::string& text) {
    return at::tensor(captions.clip_ids(text, clip_len), at::kLong).view({1, clip_len});
  };
  flux::FluxSamplingOptions o;
  o.img_size = opts.img_size > 0 ? opts.img_size : config.training.img_size;
  o.steps = opts.steps;
  o.cfg_scale = opts.guidance_scale;
  o.guidance = opts.guidance;
  o.shift = shift;
  o.seed = opts.generation.sampler.seed;
  std::fprintf(stderr, "generate: %s on %s; %s; %lld steps, guidance scale %g, %lldpx\n",
               description.c_str(), device.str().c_str(), encoders.describe().c_str(),
               static_cast<long long>(o.steps), o.cfg_scale, static_cast<long long>(o.img_size));
  const auto start = std::chrono::steady_clock::now();
  const at::Tensor images =
      flux::sample_images(model, flux_model->args(), encoders, t5_ids(*opts.prompt),
                          clip_ids(*opts.prompt), t5_ids(""), clip_ids(""), o);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  replace_file(opts.output, encode_png(flux::to_rgb8(images[0]).to(at::kCPU)));
  std::fprintf(stderr, "wrote %s (%lldx%lld) in %.2f s\n", opts.output.c_str(),
               static_cast<long long>(o.img_size), static_cast<long long>(o.img_size), seconds);
  return 0;
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
  std::string model_name = opts.model_name;
  std::string job_config_toml;
  // A diffusers FluxPipeline folder: the transformer from its transformer/ folder, the encoders
  // and the schedule from the rest.
  const std::optional<FluxPipelineFolder> pipeline =
      opts.checkpoint.empty() ? std::nullopt : read_flux_pipeline(opts.checkpoint);
  if (!opts.checkpoint.empty()) {
    ckpt::LoadedModel loaded = ckpt::load_model(pipeline ? pipeline->transformer : opts.checkpoint,
                                                dtype, opts.max_seq_len);
    model = loaded.model;
    description = loaded.model_name + " " + loaded.flavor + " from " + loaded.source;
    tokenizer_path = loaded.tokenizer_path;
    model_name = loaded.model_name;
    job_config_toml = loaded.job_config_toml;
  } else {
    const ModelSpec& spec = get_model_spec(opts.model_name);
    check_flavor(spec, opts.flavor);
    ModelBuildOptions build;
    build.max_seq_len = opts.max_seq_len;
    build.compute_dtype = dtype;
    build.seed = opts.generation.sampler.seed;
    at::manual_seed(opts.generation.sampler.seed);
    model = spec.build(opts.flavor, build);
    description = opts.model_name + " " + opts.flavor + " (random init)";
  }
  cast_parameters_for_inference(*model, dtype);
  const at::Device device =
      select_device(opts.device, /*local_rank=*/0, /*local_world_size=*/1, "--device");
  if (!device.is_cpu()) model->to(device);  // parameters and buffers (RoPE tables)
  if (get_model_spec(model_name).objective == ModelObjective::kFlowMatching) {
    if (pipeline) {
      return generate_image(opts, *model, description, tokenizer_path, pipeline->config, "custom",
                            pipeline->shift, device);
    }
    const JobConfig config = recorded_job_config(job_config_toml, opts.checkpoint);
    const std::string flavor = opts.checkpoint.empty() ? opts.flavor : config.model.flavor;
    return generate_image(opts, *model, description, tokenizer_path, config, flavor,
                          flavor != "flux-schnell", device);
  }
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
  if (opts.image) {
    const auto* vlm_model = dynamic_cast<const vlm::VlmTransformer*>(model.get());
    TITAN_CONFIG_CHECK(vlm_model != nullptr, "--image needs a vision-language model (vlm); ",
                       description, " reads text only");
    TITAN_CONFIG_CHECK(opts.prompt.has_value(),
                       "--image goes with --prompt TEXT (\"\" to caption the image), not "
                       "--prompt_ids");
    // As training cut the images: its training.max_patches_per_image (256 without a run).
    const int64_t max_patches =
        job_config_toml.empty()
            ? TrainingSection{}.max_patches_per_image
            : recorded_job_config(job_config_toml, opts.checkpoint).training.max_patches_per_image;
    const VlmImage image =
        vlm_preprocess(decode_image(read_regular_file(*opts.image, "image (--image)"), *opts.image),
                       vlm_model->vlm_args().encoder.patch_size, max_patches);
    const int64_t n = image.rows * image.columns;
    prompt = vlm_sample_tokens(*tokenizer, ImageTokens::after_vocab(*tokenizer), *opts.prompt, n,
                               /*max_len=*/std::numeric_limits<int32_t>::max());
    prompt.pop_back();  // the EOS that ends a training sample
    auto& c = opts.generation.conditioning;
    c["pixel_values"] = image.patches.unsqueeze(0).to(device);
    c["patch_mask"] = at::ones({1, n}, at::kLong).to(device);
    c["spatial_shapes"] =
        at::tensor({image.rows, image.columns}, at::kLong).view({1, 2}).to(device);
    c["image_mask"] = (at::tensor(prompt, at::kLong) == ImageTokens::after_vocab(*tokenizer).image)
                          .to(at::kLong)
                          .view({1, -1})
                          .to(device);
    std::fprintf(stderr, "generate: image %s as %lld x %lld patches\n", opts.image->c_str(),
                 static_cast<long long>(image.rows), static_cast<long long>(image.columns));
  } else if (opts.prompt_ids) {
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
