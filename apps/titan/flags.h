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
  // `--name VALUE [VALUE ...]`, repeatable: `add` receives each value (the arguments after the
  // flag up to the next "--flag").
  FlagTable& values(const std::string& name, const std::string& value_name, const std::string& help,
                    std::function<void(const std::string&)> add);
  // `--name` alone: sets *on.
  FlagTable& toggle(const std::string& name, const std::string& help, bool* on);
  // A positional argument's line in the usage (parse returns them).
  FlagTable& positional(const std::string& name, const std::string& help);
  // Lines printed after the flags (e.g. "and every config key of `titan train --help`").
  FlagTable& epilogue(const std::string& text);

  // Applies the flags in `args` and returns the other arguments in order. With
  // `pass_config_keys` an unknown "--section.key" (and the value after it, unless the flag has
  // "=" or the next argument starts with "--") is returned too, for the job-config parser after
  // this one. ConfigError: a flag without its value; an unknown flag, with the nearest known one
  // and the usage.
  std::vector<std::string> parse(const std::vector<std::string>& args,
                                 bool pass_config_keys = false) const;
  // parse(), then exactly the declared positional arguments: ConfigError "titan convert to-hf
  // takes CHECKPOINT OUT (got 1 argument)" and the usage otherwise.
  std::vector<std::string> parse_exact(const std::vector<std::string>& args) const;
  std::string usage() const;
  const std::string& synopsis() const { return synopsis_; }
  std::vector<std::string> names() const;
  // The synopsis's leading lowercase words: "titan convert to-hf".
  std::string command() const;

  // Whether `args` ask for help (--help or -h).
  static bool wants_help(const std::vector<std::string>& args);

 private:
  struct Flag {
    std::string name, value_name, help;
    std::function<void(const std::string&)> set;  // null for a toggle
    bool* on = nullptr;
    bool repeats = false;  // values(): takes every argument up to the next flag
  };
  std::string synopsis_, description_, epilogue_;
  std::vector<Flag> flags_;
  std::vector<std::pair<std::string, std::string>> positionals_;
};

// A command made of actions (`titan convert to-hf ...`, `titan data prepare ...`), each with its
// own FlagTable, in the order the help lists them.
//   actions_usage: every action's usage, one after the other (what `titan convert --help` prints);
//   choose_action: args[0] when it names an action (the first word of an action's command()),
//   else ConfigError "unknown action 'to_hf'; did you mean 'to-hf'? (want to-hf, from-hf, logits
//   or diff)" (or "missing action ...") with each action's usage line.
std::string actions_usage(const std::vector<FlagTable>& actions);
std::string choose_action(const std::vector<std::string>& args,
                          const std::vector<FlagTable>& actions);

}  // namespace titan
