// `titan flux encode`: FLUX's frozen encoders run once over a training dataset, their outputs
// saved (trainer/flux_latents.h) for training with training.dataset = "flux_latents".
#include "commands.h"

#include "titan/common/check.h"
#include "titan/config/config_manager.h"
#include "titan/trainer/flux_latents.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

namespace titan {
namespace {

constexpr const char* kUsage =
    "usage: titan flux encode --output DIR [--rows N] [--job.config_file FILE] "
    "[--section.key value ...]\n"
    "\n"
    "Runs the FLUX job's frozen encoders (the autoencoder, T5, CLIP: [encoder] and\n"
    "training.test_mode, as `titan train` builds them) once over its training dataset\n"
    "(training.dataset, training.img_size, encoder.max_t5_encoding_len) and writes each sample's\n"
    "autoencoder moments and caption encodings to DIR (written atomically; it must not exist).\n"
    "Train from them with --training.dataset flux_latents --training.dataset_path DIR: the\n"
    "encoders are then skipped; noise, timesteps and caption drops are drawn as without them.\n"
    "\n"
    "  --output DIR   the folder to write\n"
    "  --rows N       encode the first N samples only (default: all)\n";

}  // namespace

int run_flux(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  if (args[0] != "encode") {
    throw ConfigError(message("titan flux: unknown action '", args[0], "' (encode)\n", kUsage));
  }
  std::string output;
  int64_t rows = 0;
  std::vector<std::string> config_args;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--help" || args[i] == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (args[i] == "--output" || args[i] == "--rows") {
      if (i + 1 >= args.size()) throw ConfigError(message(args[i], " needs a value\n", kUsage));
      if (args[i] == "--output") {
        output = args[++i];
      } else {
        const std::optional<int64_t> n = parse_int64(args[++i]);
        if (!n || *n < 1) throw ConfigError(message("--rows expects a count >= 1, got ", args[i]));
        rows = *n;
      }
      continue;
    }
    config_args.push_back(args[i]);
  }
  if (output.empty()) throw ConfigError(message("titan flux encode needs --output DIR\n", kUsage));
  const JobConfig config = parse_job_config(config_args);
  const auto start = std::chrono::steady_clock::now();
  const int64_t written = encode_flux_latents(config, output, rows);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("wrote %lld samples' encodings to %s in %.1f s (%.1f samples/s)\n",
              static_cast<long long>(written), output.c_str(), seconds,
              static_cast<double>(written) / std::max(seconds, 1e-9));
  return 0;
}

}  // namespace titan
