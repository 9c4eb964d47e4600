// The `titan` command: train, inspect, bench, data, tokenizer, generate, convert. train, inspect
// and bench read a TorchTitan-style job config (--job.config_file plus --section.key overrides);
// the others take their own arguments. Exit codes: 0 ok, 1 runtime failure (data, divergence,
// internal error), 2 bad configuration or usage.
#include "commands.h"

#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/common/file_io.h"
#include "titan/common/logging.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void print_usage() {
  std::printf(
      "usage: titan <command> [--job.config_file FILE] [--section.key value ...]\n"
      "\n"
      "commands:\n"
      "  train     train a model (see `titan train --help` for every config key)\n"
      "  inspect   parameter counts, FLOPs per token and per-rank memory, without allocating\n"
      "  bench     time training steps (tokens/s, MFU, peak memory; --breakdown: where it goes)\n"
      "  data      corpus tools: `titan data prepare` pre-tokenizes text into token files\n"
      "  tokenizer encode / decode / bench with tokenizer files (`titan tokenizer --help`)\n"
      "  convert   Hugging Face interop: to-hf, from-hf (`titan convert --help`)\n"
      "  generate  continue a prompt with a checkpoint or HF model, KV-cached (`titan generate "
      "--help`)\n"
      "  run       launch N ranks of a command: `titan run --nproc_per_node N -- train ...` "
      "(`titan run --help`)\n"
      "  fr        flight recorder: `titan fr analyze DIR` finds where ranks' collectives "
      "diverge\n"
      "  pipeline-schedule  print a pipeline schedule's per-rank actions and bubble "
      "(`titan pipeline-schedule --help`)\n"
      "  plan      rank parallel layouts by predicted step time and memory for a cluster "
      "(`titan plan --help`)\n"
      "  plot      draw runs' metrics (loss, lr, tokens/s, memory) into one SVG "
      "(`titan plot --help`)\n");
}

int run_command(const std::string& command, const std::vector<std::string>& args) {
  if (command == "data") return titan::run_data(args);  // own arguments, not a job config
  if (command == "tokenizer") return titan::run_tokenizer(args);
  if (command == "convert") return titan::run_convert(args);
  if (command == "generate") return titan::run_generate(args);
  if (command == "run") return titan::run_launch(args);
  if (command == "selftest") return titan::run_selftest(args);
  if (command == "fr") return titan::run_fr(args);
  if (command == "pipeline-schedule") return titan::run_pipeline_schedule(args);
  if (command == "plot") return titan::run_plot(args);
  if (command == "plan") return titan::run_plan(args);
  if (titan::maybe_print_help(command, args)) return 0;
  if (command == "train") return titan::run_train(args);
  if (command == "inspect") return titan::run_inspect(args);
  if (command == "bench") return titan::run_bench(args);
  std::fprintf(stderr, "titan: unknown command '%s'\n\n", command.c_str());
  print_usage();
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  titan::configure_cpu_allocator();
  // Under `titan run` stdout is a pipe to the launcher: flush per line so ranks print live.
  if (std::getenv("TITAN_RUN") != nullptr) std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    print_usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    const int rc = run_command(command, args);
    // Output lost to a full disk or a closed file is a failure, not a success.
    if (rc == 0) titan::check_stdout_written();
    return rc;
  } catch (const titan::ConfigError& e) {
    std::fprintf(stderr, "titan %s: config error: %s\n", command.c_str(), e.what());
    return 2;
  } catch (const titan::DataError& e) {
    std::fprintf(stderr, "titan %s: data error: %s\n", command.c_str(), e.what());
    return 1;
  } catch (const titan::TrainingError& e) {
    std::fprintf(stderr, "titan %s: training error: %s\n", command.c_str(), e.what());
    return 1;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "titan %s: error: %s\n", command.c_str(), e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "titan %s: error: %s\n", command.c_str(), e.what());
    return 1;
  }
}
