// The subcommands' flag tables (see flags.h).
#include "flags.h"

#include "titan/common/check.h"
#include "titan/common/names.h"

#include <algorithm>
#include <sstream>
#include <utility>

namespace titan {

FlagTable::FlagTable(std::string synopsis, std::string description)
    : synopsis_(std::move(synopsis)), description_(std::move(description)) {}

FlagTable& FlagTable::value(const std::string& name, const std::string& value_name,
                            const std::string& help, std::function<void(const std::string&)> set) {
  flags_.push_back({name, value_name, help, std::move(set), nullptr});
  return *this;
}

FlagTable& FlagTable::values(const std::string& name, const std::string& value_name,
                             const std::string& help, std::function<void(const std::string&)> add) {
  flags_.push_back(
      {name, value_name + " [" + value_name + " ...]", help, std::move(add), nullptr, true});
  return *this;
}

FlagTable& FlagTable::toggle(const std::string& name, const std::string& help, bool* on) {
  flags_.push_back({name, "", help, nullptr, on});
  return *this;
}

FlagTable& FlagTable::positional(const std::string& name, const std::string& help) {
  positionals_.emplace_back(name, help);
  return *this;
}

FlagTable& FlagTable::epilogue(const std::string& text) {
  epilogue_ = text;
  return *this;
}

std::vector<std::string> FlagTable::names() const {
  std::vector<std::string> out;
  for (const Flag& f : flags_) out.push_back(f.name);
  return out;
}

std::string FlagTable::command() const {
  std::istringstream words(synopsis_);
  std::string word, out;
  while (words >> word) {
    const bool lowercase = std::all_of(word.begin(), word.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
    });
    if (!lowercase || word[0] == '-') break;
    out += (out.empty() ? "" : " ") + word;
  }
  return out;
}

bool FlagTable::wants_help(const std::vector<std::string>& args) {
  return std::any_of(args.begin(), args.end(),
                     [](const std::string& a) { return a == "--help" || a == "-h"; });
}

std::string FlagTable::usage() const {
  std::ostringstream os;
  os << "usage: " << synopsis_ << "\n";
  if (!description_.empty()) os << "\n" << description_ << "\n";
  // Help text in a column after the widest name, continuation lines indented to it.
  std::vector<std::pair<std::string, std::string>> rows = positionals_;
  for (const Flag& f : flags_) {
    rows.emplace_back(f.value_name.empty() ? f.name : f.name + " " + f.value_name, f.help);
  }
  size_t width = 0;
  for (const auto& [left, help] : rows) width = std::max(width, left.size());
  if (!rows.empty()) os << "\n";
  for (const auto& [left, help] : rows) {
    std::istringstream lines(help);
    std::string line;
    bool first = true;
    while (std::getline(lines, line)) {
      os << "  " << (first ? left : std::string())
         << std::string(width - (first ? left.size() : 0) + 2, ' ') << line << "\n";
      first = false;
    }
    if (first) os << "  " << left << "\n";
  }
  if (!epilogue_.empty()) os << "\n" << epilogue_ << "\n";
  return os.str();
}

std::vector<std::string> FlagTable::parse(const std::vector<std::string>& args,
                                          bool pass_config_keys) const {
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.size() < 2 || arg[0] != '-' || arg == "-") {
      rest.push_back(arg);
      continue;
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const auto flag =
        std::find_if(flags_.begin(), flags_.end(), [&](const Flag& f) { return f.name == name; });
    if (flag == flags_.end()) {
      const bool config_key = name.rfind("--", 0) == 0 && name.find('.') != std::string::npos;
      TITAN_CONFIG_CHECK(pass_config_keys && config_key, "unknown argument '", arg, "'",
                         did_you_mean(likely_name(name, names())), "\n", usage());
      rest.push_back(arg);
      const bool takes_next =
          eq == std::string::npos && i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0;
      if (takes_next) rest.push_back(args[++i]);
      continue;
    }
    if (flag->on != nullptr) {
      TITAN_CONFIG_CHECK(eq == std::string::npos, flag->name, " takes no value\n", usage());
      *flag->on = true;
      continue;
    }
    if (eq != std::string::npos) {
      flag->set(arg.substr(eq + 1));
      continue;
    }
    TITAN_CONFIG_CHECK(i + 1 < args.size() && (!flag->repeats || args[i + 1].rfind("--", 0) != 0),
                       flag->name, " needs a value (", flag->value_name, ")\n", usage());
    flag->set(args[++i]);
    while (flag->repeats && i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
      flag->set(args[++i]);
    }
  }
  return rest;
}

std::vector<std::string> FlagTable::parse_exact(const std::vector<std::string>& args) const {
  std::vector<std::string> rest = parse(args);
  std::string names;
  for (const auto& [name, help] : positionals_) names += (names.empty() ? "" : " ") + name;
  TITAN_CONFIG_CHECK(rest.size() == positionals_.size(), command(), " takes ",
                     names.empty() ? std::string("no arguments") : names, " (got ", rest.size(),
                     rest.size() == 1 ? " argument" : " arguments", ")\n", usage());
  return rest;
}

std::string actions_usage(const std::vector<FlagTable>& actions) {
  std::string out;
  for (const FlagTable& a : actions) out += (out.empty() ? "" : "\n") + a.usage();
  return out;
}

std::string choose_action(const std::vector<std::string>& args,
                          const std::vector<FlagTable>& actions) {
  std::vector<std::string> names;
  std::string want, lines, command;
  for (const FlagTable& a : actions) {
    const std::string full = a.command();
    const size_t last = full.rfind(' ');
    names.push_back(full.substr(last + 1));
    command = full.substr(0, last);
    const std::string first_line = a.synopsis().substr(0, a.synopsis().find('\n'));
    lines += (lines.empty() ? "usage: " : "       ") + first_line + "\n";
  }
  if (!args.empty() && std::find(names.begin(), names.end(), args[0]) != names.end()) {
    return args[0];
  }
  for (size_t i = 0; i < names.size(); ++i) {
    want += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  }
  const bool named = !args.empty() && !args[0].empty() && args[0][0] != '-';
  throw ConfigError(message(
      named ? message("unknown action '", args[0], "'", did_you_mean(likely_name(args[0], names)))
            : std::string("missing action"),
      " (want ", want, ")\n", lines, "`", command, " --help` lists each action's flags"));
}

}  // namespace titan
