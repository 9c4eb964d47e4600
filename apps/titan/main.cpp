// The `titan` command: one table of subcommands (commands() below) gives the usage, the dispatch
// and the "did you mean" for an unknown one. train, inspect and bench read a TorchTitan-style job
// config (--job.config_file plus --section.key overrides);
// the others take their own arguments. Exit codes: 0 ok, 1 runtime failure (data, divergence,
// internal error), 2 bad configuration or usage.
#include "commands.h"

#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/common/file_io.h"
#include "titan/common/logging.h"
#include "titan/common/names.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

// Every command once: its name, what `titan --help` says of it (hidden: not listed), whether it
// reads a job config (its --help is then the config's, maybe_print_help), and its entry point.
struct Command {
  const char* name;
  const char* summary;
  bool job_config;
  int (*run)(const std::vector<std::string>& args);
};

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"train", "train a model (see `titan train --help` for every config key)", true,
       titan::run_train},
      {"inspect", "parameter counts, FLOPs per token and per-rank memory, without allocating", true,
       titan::run_inspect},
      {"bench", "time training steps (tokens/s, MFU, peak memory; --breakdown: where it goes)",
       false, titan::run_bench},  // its own --help: its flags, then the config's
      {"data", "corpus tools: `titan data prepare` pre-tokenizes text into token files", false,
       titan::run_data},
      {"tokenizer", "encode / decode / bench with tokenizer files (`titan tokenizer --help`)",
       false, titan::run_tokenizer},
      {"convert", "Hugging Face interop: to-hf, from-hf (`titan convert --help`)", false,
       titan::run_convert},
      {"generate",
       "continue a prompt with a checkpoint or HF model, KV-cached (`titan generate --help`)",
       false, titan::run_generate},
      {"run",
       "launch N ranks of a command: `titan run --nproc_per_node N -- train ...` (`titan run "
       "--help`)",
       false, titan::run_launch},
      {"fr", "flight recorder: `titan fr analyze DIR` finds where ranks' collectives diverge",
       false, titan::run_fr},
      {"pipeline-schedule",
       "print a pipeline schedule's per-rank actions and bubble (`titan pipeline-schedule "
       "--help`)",
       false, titan::run_pipeline_schedule},
      {"plan",
       "rank parallel layouts by predicted step time and memory for a cluster (`titan plan "
       "--help`)",
       false, titan::run_plan},
      {"plot", "draw runs' metrics (loss, lr, tokens/s, memory) into one SVG (`titan plot --help`)",
       false, titan::run_plot},
      {"flux", "FLUX: `titan flux encode` precomputes a dataset's latents and caption encodings",
       false, titan::run_flux},
      {"ft",
       "fault-tolerant replica groups: `titan ft lighthouse` coordinates them (`titan ft "
       "--help`)",
       false, titan::run_ft},
      {"selftest", nullptr, false, titan::run_selftest},  // the multi-process launch check
  };
  return table;
}

void print_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: titan <command> [--job.config_file FILE] [--section.key value ...]\n"
               "\n"
               "commands:\n");
  for (const Command& c : commands()) {
    if (c.summary == nullptr) continue;
    std::fprintf(out, "  %-9s %s%s\n", c.name, std::strlen(c.name) > 9 ? " " : "", c.summary);
  }
}

int run_command(const std::string& name, const std::vector<std::string>& args) {
  std::vector<std::string> names;
  for (const Command& c : commands()) {
    if (name == c.name) {
      if (c.job_config && titan::maybe_print_help(name, args)) return 0;
      return c.run(args);
    }
    if (c.summary != nullptr) names.push_back(c.name);
  }
  std::fprintf(stderr, "titan: unknown command '%s'%s\n\n", name.c_str(),
               titan::did_you_mean(titan::likely_name(name, names)).c_str());
  print_usage(stderr);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  titan::configure_cpu_allocator();
  // Under `titan run` stdout is a pipe to the launcher: flush per line so ranks print live.
  if (std::getenv("TITAN_RUN") != nullptr) std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    print_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  // Before any command's parallel work (titan/common/cpu.h says why).
  titan::warm_up_vector_math();
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
