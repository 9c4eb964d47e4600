// Launch-environment detection. Each launcher family has its own reader; they share the integer
// parsing and the consistency checks, so every error names the variable the user has to fix.
#include "titan/distributed/launch_env.h"

#include "titan/common/check.h"

#include <cctype>
#include <cstdlib>
#include <sstream>

namespace titan {
namespace {

// The variable names one launcher family uses, for error messages.
struct VarNames {
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
};

// Strict base-10 integer ("12", not "12x" or ""); `what` names it in the error.
int64_t parse_int(const std::string& text, const std::string& what) {
  size_t pos = 0;
  int64_t value = 0;
  bool ok = !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-');
  if (ok) {
    try {
      value = std::stoll(text, &pos, 10);
    } catch (const std::exception&) {
      ok = false;
    }
  }
  if (!ok || pos != text.size()) {
    throw ConfigError(message(what, "='", text, "' is not an integer"));
  }
  return value;
}

std::optional<int64_t> int_var(const EnvLookup& env, const std::string& name) {
  auto value = env(name);
  if (!value) return std::nullopt;
  return parse_int(*value, name);
}

int64_t required_int(const EnvLookup& env, const std::string& name, const std::string& why) {
  auto value = int_var(env, name);
  if (!value) throw ConfigError(message(name, " is not set; ", why));
  return *value;
}

// Range checks shared by every family: 0 <= rank < world, 0 <= local_rank < local_world <= world.
void check_consistent(const LaunchEnv& e, const VarNames& n) {
  auto fail = [](const std::string& msg) { throw ConfigError(msg); };
  if (e.world_size < 1)
    fail(std::string(n.world_size) + "=" + std::to_string(e.world_size) + " must be >= 1");
  if (e.rank < 0 || e.rank >= e.world_size) {
    fail(std::string(n.rank) + "=" + std::to_string(e.rank) + " is not in [0, " + n.world_size +
         "=" + std::to_string(e.world_size) + ")");
  }
  if (e.local_world_size < 1 || e.local_world_size > e.world_size) {
    fail(std::string(n.local_world_size) + "=" + std::to_string(e.local_world_size) +
         " is not in [1, " + n.world_size + "=" + std::to_string(e.world_size) + "]");
  }
  if (e.local_rank < 0 || e.local_rank >= e.local_world_size) {
    fail(std::string(n.local_rank) + "=" + std::to_string(e.local_rank) + " is not in [0, " +
         n.local_world_size + "=" + std::to_string(e.local_world_size) + ")");
  }
  if (e.master_port < 1 || e.master_port > 65535) {
    fail("MASTER_PORT=" + std::to_string(e.master_port) + " is not a TCP port (1..65535)");
  }
  if (e.node_rank < 0) fail("node rank " + std::to_string(e.node_rank) + " must be >= 0");
}

// RANK/WORLD_SIZE family: titan run, torchrun, or a hand-written env:// launch.
LaunchEnv from_torch_env(const EnvLookup& env) {
  LaunchEnv e;
  e.source = env("TITAN_RUN") ? "titan run" : env("TORCHELASTIC_RUN_ID") ? "torchrun" : "env";
  const std::string hint = "set RANK and WORLD_SIZE together (torchrun and `titan run` set both)";
  e.rank = required_int(env, "RANK", hint);
  e.world_size = required_int(env, "WORLD_SIZE", hint);
  e.local_world_size = int_var(env, "LOCAL_WORLD_SIZE").value_or(e.world_size);  // one node
  e.local_rank =
      int_var(env, "LOCAL_RANK").value_or(e.local_world_size > 0 ? e.rank % e.local_world_size : 0);
  e.node_rank =
      int_var(env, "GROUP_RANK").value_or(e.local_world_size > 0 ? e.rank / e.local_world_size : 0);
  if (e.world_size > 1) {
    auto addr = env("MASTER_ADDR");
    if (addr) {
      e.master_addr = *addr;
    } else if (e.local_world_size < e.world_size) {
      throw ConfigError(
          "MASTER_ADDR is not set; a job over several nodes needs rank 0's host name");
    }
    e.master_port = required_int(env, "MASTER_PORT",
                                 "every rank needs the port of rank 0's store (e.g. 29500)");
  }
  if (env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True") {
    e.agent_store = true;
    e.store_prefix = "/worker/attempt_" + env("TORCHELASTIC_RESTART_COUNT").value_or("0");
  }
  check_consistent(e, {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"});
  return e;
}

std::optional<std::string> first_set(const EnvLookup& env, std::initializer_list<const char*> names,
                                     std::string* which) {
  for (const char* name : names) {
    if (auto value = env(name)) {
      *which = name;
      return value;
    }
  }
  return std::nullopt;
}

LaunchEnv from_slurm(const EnvLookup& env) {
  LaunchEnv e;
  e.source = "slurm";
  e.rank = required_int(env, "SLURM_PROCID", "");
  e.world_size = required_int(
      env, "SLURM_NTASKS", "SLURM_PROCID is set but the task count is not; launch ranks with srun");
  e.local_rank = required_int(env, "SLURM_LOCALID", "srun sets it for every task");
  e.node_rank = int_var(env, "SLURM_NODEID").value_or(0);

  std::string which;
  if (auto spec = first_set(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}, &which)) {
    const std::vector<int64_t> per_node = expand_tasks_per_node(*spec);
    if (e.node_rank >= static_cast<int64_t>(per_node.size())) {
      throw ConfigError(message("SLURM_NODEID=", e.node_rank, " but ", which, "='", *spec,
                                "' lists ", per_node.size(), " node(s)"));
    }
    e.local_world_size = per_node[e.node_rank];
  } else if (auto n = int_var(env, "SLURM_NTASKS_PER_NODE")) {
    e.local_world_size = *n;
  } else {
    e.local_world_size = e.world_size;  // no per-node counts: assume one node
  }

  if (auto addr = env("MASTER_ADDR")) {
    e.master_addr = *addr;
  } else if (auto list = first_set(
                 env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}, &which)) {
    const std::vector<std::string> hosts = expand_hostlist(*list);
    if (hosts.empty())
      throw ConfigError(message(which, " is empty; set MASTER_ADDR to rank 0's host"));
    e.master_addr = hosts.front();
  } else if (e.world_size > 1) {
    throw ConfigError(
        "SLURM_JOB_NODELIST is not set (nor SLURM_STEP_NODELIST, SLURM_NODELIST, "
        "MASTER_ADDR); cannot tell which host runs rank 0");
  }
  if (auto port = int_var(env, "MASTER_PORT")) {
    e.master_port = *port;
  } else if (auto job = int_var(env, "SLURM_JOB_ID")) {
    // Every task of a job derives the same port; different jobs sharing a node rarely collide.
    e.master_port = 15000 + (*job % 20000);
  }
  check_consistent(e, {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "tasks per node"});
  return e;
}

LaunchEnv from_openmpi(const EnvLookup& env) {
  LaunchEnv e;
  e.source = "openmpi";
  const std::string hint = "mpirun sets OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE together";
  e.rank = required_int(env, "OMPI_COMM_WORLD_RANK", hint);
  e.world_size = required_int(env, "OMPI_COMM_WORLD_SIZE", hint);
  e.local_world_size = int_var(env, "OMPI_COMM_WORLD_LOCAL_SIZE").value_or(e.world_size);
  e.local_rank = int_var(env, "OMPI_COMM_WORLD_LOCAL_RANK")
                     .value_or(e.local_world_size > 0 ? e.rank % e.local_world_size : 0);
  e.node_rank = e.local_world_size > 0 ? e.rank / e.local_world_size : 0;  // block mapping
  if (auto addr = env("MASTER_ADDR")) {
    e.master_addr = *addr;
  } else if (e.local_world_size < e.world_size) {
    throw ConfigError(
        "MASTER_ADDR is not set; an mpirun job over several nodes needs rank 0's "
        "host: `mpirun -x MASTER_ADDR=<host> -x MASTER_PORT=<port> ...`");
  }
  if (auto port = int_var(env, "MASTER_PORT")) e.master_port = *port;
  check_consistent(e, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                       "OMPI_COMM_WORLD_LOCAL_SIZE"});
  return e;
}

// Splits at commas that are not inside brackets.
std::vector<std::string> split_top_level(const std::string& text, const std::string& what) {
  std::vector<std::string> items;
  std::string current;
  int depth = 0;
  for (char c : text) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) throw ConfigError(message(what, " '", text, "': unbalanced ']'"));
    if (c == ',' && depth == 0) {
      items.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (depth != 0) throw ConfigError(message(what, " '", text, "': unbalanced '['"));
  items.push_back(current);
  return items;
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

constexpr size_t kMaxHosts = 1 << 20;

// "01-03,07" -> {"01", "02", "03", "07"}: the width of a range's lower bound is kept.
std::vector<std::string> expand_bracket(const std::string& body, const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(body);
  std::string part;
  while (std::getline(ss, part, ',')) {
    const size_t dash = part.find('-');
    const std::string lo = part.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : part.substr(dash + 1);
    if (!all_digits(lo) || !all_digits(hi)) {
      throw ConfigError(
          message("hostlist '", list, "': '", part, "' is not a number or a range a-b"));
    }
    const int64_t a = parse_int(lo, "hostlist range bound");
    const int64_t b = parse_int(hi, "hostlist range bound");
    if (b < a || static_cast<size_t>(b - a) > kMaxHosts) {
      throw ConfigError(message("hostlist '", list, "': bad range '", part, "'"));
    }
    for (int64_t i = a; i <= b; ++i) {
      std::string digits = std::to_string(i);
      if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');
      out.push_back(digits);
    }
  }
  if (out.empty()) throw ConfigError(message("hostlist '", list, "': empty brackets"));
  return out;
}

}  // namespace

std::string LaunchEnv::describe() const {
  std::ostringstream os;
  os << "rank " << rank << "/" << world_size << " (local " << local_rank << "/" << local_world_size
     << ", node " << node_rank << "), launched by " << source;
  if (world_size > 1) os << ", store " << master_addr << ":" << master_port;
  return os.str();
}

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

LaunchEnv detect_launch_env(const EnvLookup& env) {
  if (env("RANK") || env("WORLD_SIZE")) return from_torch_env(env);
  if (env("SLURM_PROCID")) return from_slurm(env);
  if (env("OMPI_COMM_WORLD_RANK") || env("OMPI_COMM_WORLD_SIZE")) return from_openmpi(env);
  return LaunchEnv{};
}

std::vector<std::string> expand_hostlist(const std::string& hostlist) {
  std::vector<std::string> hosts;
  for (const std::string& item : split_top_level(hostlist, "hostlist")) {
    if (item.empty()) continue;
    // Expand bracket groups left to right: each group multiplies the partial names.
    std::vector<std::string> names = {""};
    size_t pos = 0;
    while (pos < item.size()) {
      const size_t open = item.find('[', pos);
      const std::string text =
          item.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
      for (auto& n : names) n += text;
      if (open == std::string::npos) break;
      const size_t close = item.find(']', open);
      const std::vector<std::string> parts =
          expand_bracket(item.substr(open + 1, close - open - 1), hostlist);
      if (names.size() * parts.size() > kMaxHosts) {
        throw ConfigError(message("hostlist '", hostlist, "' expands to too many hosts"));
      }
      std::vector<std::string> next;
      next.reserve(names.size() * parts.size());
      for (const auto& n : names) {
        for (const auto& p : parts) next.push_back(n + p);
      }
      names = std::move(next);
      pos = close + 1;
    }
    hosts.insert(hosts.end(), names.begin(), names.end());
  }
  return hosts;
}

std::vector<int64_t> expand_tasks_per_node(const std::string& spec) {
  std::vector<int64_t> out;
  for (const std::string& item : split_top_level(spec, "tasks per node")) {
    const size_t paren = item.find('(');
    const int64_t tasks = parse_int(item.substr(0, paren), "tasks per node '" + spec + "'");
    int64_t repeat = 1;
    if (paren != std::string::npos) {
      const size_t close = item.find(')', paren);
      if (close != item.size() - 1 || item.compare(paren, 2, "(x") != 0) {
        throw ConfigError(
            message("tasks per node '", spec, "': expected N or N(xM), got '", item, "'"));
      }
      repeat =
          parse_int(item.substr(paren + 2, close - paren - 2), "tasks per node '" + spec + "'");
    }
    if (tasks < 1 || repeat < 1 || repeat > static_cast<int64_t>(kMaxHosts)) {
      throw ConfigError(message("tasks per node '", spec, "': bad item '", item, "'"));
    }
    out.insert(out.end(), static_cast<size_t>(repeat), tasks);
  }
  return out;
}

std::vector<bool> parse_log_ranks(const std::string& spec, int64_t world_size) {
  std::vector<bool> selected(static_cast<size_t>(world_size), false);
  const std::string text = spec.empty() ? "0" : spec;
  if (text == "all" || text == "*") return std::vector<bool>(static_cast<size_t>(world_size), true);
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    const size_t dash = part.find('-', 1);
    const int64_t lo = parse_int(part.substr(0, dash), "LOG_RANK");
    const int64_t hi =
        dash == std::string::npos ? lo : parse_int(part.substr(dash + 1), "LOG_RANK");
    if (lo < 0 || hi < lo || hi >= world_size) {
      throw ConfigError(message("LOG_RANK='", spec, "': '", part,
                                "' is not a rank or range within [0, ", world_size, ")"));
    }
    for (int64_t r = lo; r <= hi; ++r) selected[static_cast<size_t>(r)] = true;
  }
  return selected;
}

}  // namespace titan
