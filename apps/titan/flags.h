// One table of a subcommand's flags: it parses the command line, writes the usage that --help
// prints, and refuses an unknown flag naming the nearest one, so the three never disagree.
//
//   FlagTable flags("titan plot RUN [RUN ...] [flags]", "Draws the metrics of ...");
//   flags.positional("RUN", "a run's job.dump_folder ...")
//       .value("--out", "FILE.svg", "the file to write (default plot.svg)",
//              [&](const std::string& v) { opts.out = v; })
//       .toggle("--log-loss", "log scale for the losses", &opts.log_loss);
//   if (FlagTable::wants_help(args)) { std::fputs(flags.usage().c_str(), stdout); return 0; }
//   opts.runs = flags.parse(args);   // the positional arguments, in order
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace titan {

class FlagTable {
 public:
  // `synopsis`: the usage line after "usage: "; `description`: the paragraph under it.
  FlagTable(std::string synopsis, std::string description);

  // `--name VALUE` (or `--name=VALUE`): `set` receives the value (it throws ConfigError for a
  // bad one, naming the flag).
  FlagTable& value(const std::string& name, const std::string& value_name, const std::string& help,
                   std::function<void(const std::string&)> set);
  // `--name` alone: sets *on.
  FlagTable& toggle(const std::string& name, const std::string& help, bool* on);
  // A positional argument's line in the usage (parse returns them).
  FlagTable& positional(const std::string& name, const std::string& help);
  // Lines printed after the flags (e.g. "and every config key of `titan train --help`").
  FlagTable& epilogue(const std::string& text);

  // Applies the flags in `args` and returns the other arguments in order. With `pass_unknown`
  // an unknown "--flag" (and the value after it, unless the flag has "=" or the next argument
  // starts with "--") is returned too, for a parser after this one (config overrides).
  // ConfigError: a flag without its value; an unknown flag (without pass_unknown), with the
  // nearest known one and the usage.
  std::vector<std::string> parse(const std::vector<std::string>& args,
                                 bool pass_unknown = false) const;
  std::string usage() const;
  std::vector<std::string> names() const;

  // Whether `args` ask for help (--help or -h).
  static bool wants_help(const std::vector<std::string>& args);

 private:
  struct Flag {
    std::string name, value_name, help;
    std::function<void(const std::string&)> set;  // null for a toggle
    bool* on = nullptr;
  };
  std::string synopsis_, description_, epilogue_;
  std::vector<Flag> flags_;
  std::vector<std::pair<std::string, std::string>> positionals_;
};

}  // namespace titan
