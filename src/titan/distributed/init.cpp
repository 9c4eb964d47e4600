// Rendezvous over c10d's TCPStore. The store is created without c10d's own worker count so that
// arrivals are counted here: on a timeout each rank can then say which ranks never registered
// (their "titan/rdzv/rank/<r>" key is missing) instead of c10d's bare "timed out".
#include "titan/distributed/init.h"

#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/common/device.h"
#include "titan/common/format.h"
#include "titan/common/logging.h"
#include "titan/distributed/flight_recorder.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace titan {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kArrived = "titan/rdzv/arrived";
constexpr const char* kWorld = "titan/rdzv/world_size";
constexpr const char* kOutcome = "titan/rdzv/outcome";  // "ok" or why the rendezvous failed
constexpr const char* kVerdictRead = "titan/rdzv/outcome_read";
constexpr auto kVerdictGrace = std::chrono::seconds(2);
constexpr const char* kExited = "titan/rdzv/exited";
constexpr auto kPoll = std::chrono::milliseconds(20);
constexpr int64_t kMaxMissingListed = 16;

std::string rank_key(int64_t rank) { return "titan/rdzv/rank/" + std::to_string(rank); }
std::string exited_key(int64_t rank) { return std::string(kExited) + "/" + std::to_string(rank); }

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

// error_text (check.h) without a trailing period, since our messages go on after it.
std::string error_clause(const std::exception& e) {
  std::string msg = error_text(e);
  while (!msg.empty() &&
         (msg.back() == '.' || std::isspace(static_cast<unsigned char>(msg.back())))) {
    msg.pop_back();
  }
  return msg;
}

std::string seconds(std::chrono::milliseconds t) {
  std::ostringstream os;
  os << t.count() / 1000.0 << " s";
  return os.str();
}

// A MASTER_ADDR that does not resolve fails inside c10d as a bind or connect error (rank 0's
// hint would blame the port); say what is wrong instead. Only definite answers count: a
// temporary resolver failure is left to c10d's retries.
void check_master_addr_resolves(const LaunchEnv& env) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(env.master_addr.c_str(), nullptr, &hints, &found);
  if (found != nullptr) freeaddrinfo(found);
  bool definite = rc == EAI_NONAME || rc == EAI_FAIL;
#ifdef EAI_NODATA
  definite = definite || rc == EAI_NODATA;
#endif
  if (definite) {
    throw ConfigError(
        message("MASTER_ADDR '", env.master_addr, "' (rank ", env.rank,
                "'s store host) cannot be resolved: ", gai_strerror(rc),
                ". HINT: set MASTER_ADDR (titan run --master_addr) to the host name or IP "
                "address of the node running rank 0; 127.0.0.1 for one node"));
  }
}

c10::intrusive_ptr<c10d::Store> connect_store(const LaunchEnv& env,
                                              std::chrono::milliseconds timeout) {
  check_master_addr_resolves(env);
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(env.master_port);
  opts.isServer = env.rank == 0 && !env.agent_store;
  // numWorkers stays unset: arrivals are counted by join() below, which can name the missing.
  opts.waitWorkers = false;
  opts.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
  } catch (const std::exception& e) {
    const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
    if (opts.isServer) {
      throw RendezvousError("rank 0 could not host the store on port " +
                            std::to_string(env.master_port) + ": " + error_clause(e) +
                            ". HINT: another job may hold the port; choose another MASTER_PORT");
    }
    throw RendezvousError(
        "rank " + std::to_string(env.rank) + " could not reach the store at " + where + " within " +
        seconds(timeout) + " (comm.init_timeout_seconds): " + error_clause(e) +
        ". HINT: check that rank 0 started and that every rank has the same MASTER_ADDR and "
        "MASTER_PORT");
  }
  if (env.agent_store) store = c10::make_intrusive<c10d::PrefixStore>(env.store_prefix, store);
  return store;
}

// "ranks 2, 5 (and 3 more)" for the ranks whose key (registration by default) is absent.
std::string missing_ranks(c10d::Store& store, int64_t world_size,
                          std::string (*key)(int64_t) = rank_key) {
  std::vector<int64_t> missing;
  int64_t extra = 0;
  for (int64_t r = 0; r < world_size; ++r) {
    if (store.check({key(r)})) continue;
    if (static_cast<int64_t>(missing.size()) < kMaxMissingListed) {
      missing.push_back(r);
    } else {
      ++extra;
    }
  }
  if (missing.empty()) return "";
  std::ostringstream os;
  os << (missing.size() + extra == 1 ? "rank " : "ranks ");
  os << titan::join(missing);  // qualified: this file's join() is the rendezvous
  if (extra > 0) os << " (and " << extra << " more)";
  return os.str();
}

// The timeout message, with the ranks whose registration key is missing.
std::string timeout_message(c10d::Store& store, const LaunchEnv& env,
                            std::chrono::milliseconds timeout) {
  const int64_t arrived = store.add(kArrived, 0);
  const std::string missing = missing_ranks(store, env.world_size);
  return "rendezvous timed out after " + seconds(timeout) +
         " (comm.init_timeout_seconds): " + std::to_string(arrived) + " of " +
         std::to_string(env.world_size) + " ranks arrived at " + env.master_addr + ":" +
         std::to_string(env.master_port) + (missing.empty() ? "" : "; missing: " + missing) +
         ". HINT: check that every rank was started (same MASTER_ADDR, MASTER_PORT, WORLD_SIZE) "
         "and did not fail before joining";
}

// Registers this rank and waits for the others. Rank 0 counts arrivals and writes the outcome
// ("ok" or the timeout message) to kOutcome; the other ranks wait for that one key, so a large
// job does not poll the store from every rank, and every rank reports the same missing ranks.
void join(c10d::Store& store, const LaunchEnv& env, std::chrono::milliseconds timeout,
          Clock::time_point deadline) {
  // Every rank must agree on the world size: the first to arrive records it.
  const std::string world = std::to_string(env.world_size);
  const std::string recorded = text(store.compareSet(kWorld, {}, bytes(world)));
  if (recorded != world) {
    throw RendezvousError("rank " + std::to_string(env.rank) + " was started with world size " +
                          world + " but another rank registered world size " + recorded +
                          ". HINT: every rank needs the same WORLD_SIZE (or SLURM_NTASKS)");
  }
  // A rank registers once; a second process with the same rank is a launch mistake.
  if (store.add(rank_key(env.rank) + "/claims", 1) != 1) {
    throw RendezvousError("two processes were started as rank " + std::to_string(env.rank) +
                          ". HINT: check RANK / SLURM_PROCID / OMPI_COMM_WORLD_RANK");
  }
  store.set(rank_key(env.rank), bytes(host_name() + " pid " + std::to_string(getpid())));
  store.add(kArrived, 1);

  if (env.rank == 0) {
    int64_t arrived = 0;
    while ((arrived = store.add(kArrived, 0)) < env.world_size && Clock::now() < deadline) {
      std::this_thread::sleep_for(kPoll);
    }
    const std::string outcome =
        arrived >= env.world_size ? "ok" : timeout_message(store, env, timeout);
    store.set(kOutcome, bytes(outcome));
    // Rank 0 may host the store: let the ranks that arrived read the verdict before it goes,
    // also on success (a rank 0 failing right after the rendezvous, e.g. on a config error,
    // would cut them off mid-read and they would blame a lost store).
    const auto until = Clock::now() + kVerdictGrace;
    while (store.add(kVerdictRead, 0) < std::min(arrived, env.world_size) - 1 &&
           Clock::now() < until) {
      std::this_thread::sleep_for(kPoll);
    }
    if (outcome != "ok") throw RendezvousError(outcome);
    return;
  }
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  try {
    store.wait({kOutcome}, std::max(left, std::chrono::milliseconds(0)) + kVerdictGrace);
  } catch (const std::exception&) {
    // No verdict: rank 0 never arrived (possible when torchrun's agent hosts the store).
    throw RendezvousError(timeout_message(store, env, timeout));
  }
  const std::string outcome = text(store.get(kOutcome));
  store.add(kVerdictRead, 1);
  if (outcome != "ok") throw RendezvousError(outcome);
}

}  // namespace

std::string address_towards(const std::string& host, int64_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    throw dist::CommError("master_addr '" + host + "' does not resolve (" + gai_strerror(rc) +
                          "). HINT: set --master_addr / MASTER_ADDR to an address every node can "
                          "reach");
  }
  std::string error;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    // Connecting a UDP socket sends nothing: the kernel only picks the route and source address.
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text_addr[INET6_ADDRSTRLEN] = {};
      const void* raw =
          local.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      close(fd);
      if (inet_ntop(local.ss_family, raw, text_addr, sizeof(text_addr)) != nullptr) {
        freeaddrinfo(found);
        return text_addr;
      }
      continue;
    }
    error = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  throw dist::CommError("no network route from this host to master_addr " + host + ":" +
                        std::to_string(port) + (error.empty() ? "" : " (" + error + ")") +
                        ". HINT: check the node's interfaces and routes, or name the interface "
                        "that reaches the master with GLOO_SOCKET_IFNAME");
}

namespace {

struct Interface {
  std::vector<std::string> addresses;
  bool up = false;
  bool loopback = false;
};

// This host's interfaces by name, with their IPv4/IPv6 addresses.
std::map<std::string, Interface> host_interfaces() {
  std::map<std::string, Interface> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    Interface& i = out[a->ifa_name];
    i.up = i.up || (a->ifa_flags & IFF_UP) != 0;
    i.loopback = i.loopback || (a->ifa_flags & IFF_LOOPBACK) != 0;
    if (a->ifa_addr == nullptr) continue;
    const int family = a->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    char text_addr[INET6_ADDRSTRLEN] = {};
    const void* raw =
        family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr)
            : static_cast<const void*>(
                  &reinterpret_cast<const sockaddr_in6*>(a->ifa_addr)->sin6_addr);
    if (inet_ntop(family, raw, text_addr, sizeof(text_addr)) != nullptr) {
      i.addresses.push_back(text_addr);
    }
  }
  freeifaddrs(list);
  return out;
}

// "lo 127.0.0.1, eth0 10.0.0.2"
std::string interfaces_text(const std::map<std::string, Interface>& all) {
  std::string s;
  for (const auto& [name, i] : all) {
    if (i.addresses.empty()) continue;
    s += (s.empty() ? "" : ", ") + name + " " + i.addresses.front() + (i.up ? "" : " (down)");
  }
  return s.empty() ? "none with an address" : s;
}

// Every interface GLOO_SOCKET_IFNAME names must exist here, be up and have an address; a
// loopback one cannot carry a job whose master is reached over the network (the ranks of the
// other nodes would dial their own loopback).
void check_socket_ifnames(const std::string& ifnames, const LaunchEnv& env) {
  const auto all = host_interfaces();
  std::string route;  // "eth0 (10.0.0.2)": where the route to the master leaves
  std::string local;
  try {
    local = address_towards(env.master_addr, env.master_port);
    for (const auto& [name, i] : all) {
      if (std::find(i.addresses.begin(), i.addresses.end(), local) != i.addresses.end()) {
        route = name + " (" + local + ")";
      }
    }
  } catch (const std::exception&) {
  }
  const std::string hint = route.empty()
                               ? ""
                               : "; the route to the master leaves from " + route +
                                     ": GLOO_SOCKET_IFNAME=" + route.substr(0, route.find(' '));
  std::stringstream names(ifnames);
  std::string name;
  while (std::getline(names, name, ',')) {
    if (name.empty()) continue;
    const auto found = all.find(name);
    const std::string what = "GLOO_SOCKET_IFNAME=" + ifnames + ": ";
    if (found == all.end() || found->second.addresses.empty()) {
      throw dist::CommError(what + "this host has no interface " + name +
                            " with an address (it has " + interfaces_text(all) + ")" + hint);
    }
    if (!found->second.up) {
      throw dist::CommError(what + "interface " + name +
                            " is down (interfaces: " + interfaces_text(all) + ")" + hint);
    }
    const bool master_via_loopback = local.rfind("127.", 0) == 0 || local == "::1";
    if (found->second.loopback && env.world_size != env.local_world_size && !local.empty() &&
        !master_via_loopback) {
      throw dist::CommError(what + name + " is the loopback interface, which the ranks of other " +
                            "nodes cannot reach (master_addr " + env.master_addr + " is reached " +
                            "over the network)" + hint);
    }
  }
}

// "node 1, host gpu7, 10.0.0.2": the node, the host name and the address other nodes reach it at
// (where the route to the master leaves; the host name alone may resolve to loopback).
std::string where_this_rank_runs(const LaunchEnv& env) {
  std::string where = "node " + std::to_string(env.node_rank) + ", host " + host_name();
  if (env.master_addr == "127.0.0.1" || env.master_addr == "localhost") return where;
  try {
    return where + ", " + address_towards(env.master_addr, env.master_port);
  } catch (const std::exception&) {
    return where;  // world_group_options reports an unroutable master
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Store> rendezvous(const LaunchEnv& env,
                                           std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  c10::intrusive_ptr<c10d::Store> store = connect_store(env, timeout);
  store->setTimeout(timeout + kVerdictGrace);
  try {
    join(*store, env, timeout, deadline);
  } catch (const RendezvousError&) {
    throw;
  } catch (const std::exception& e) {
    throw RendezvousError("rank " + std::to_string(env.rank) + " lost the store at " +
                          env.master_addr + ":" + std::to_string(env.master_port) +
                          " during the rendezvous (" + error_clause(e) +
                          "). HINT: the rank hosting it (rank 0) probably failed; see its output");
  }
  return store;
}

DistributedContext init_distributed(const CommSection& comm) {
  return init_distributed(comm, detect_launch_env());
}

DistributedContext init_distributed(const CommSection& comm, const LaunchEnv& env) {
  DistributedContext dist;
  dist.env = env;
  if (!env.distributed()) return dist;
  if (env.source != "titan run") {
    // titan run prefixes and filters child output itself; other launchers do not by default.
    const auto log_rank = process_env()("LOG_RANK").value_or("0");
    const bool print_info =
        parse_log_ranks(log_rank, env.world_size)[static_cast<size_t>(env.rank)];
    set_log_rank_filter("[rank " + std::to_string(env.rank) + "] ", print_info);
  }
  const auto start = Clock::now();
  dist.store = rendezvous(env, std::chrono::seconds(comm.init_timeout_seconds));
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  log_info("distributed: ", env.describe(), "; all ", env.world_size, " ranks joined in ",
           seconds(ms));
  dist::Liveness::Options beat;
  beat.store_address = env.master_addr + ":" + std::to_string(env.master_port);
  // Another node's `titan run` stopped the job: end now, as its own ranks were (SIGTERM: the
  // interrupt line names the last checkpoint), not at the next collective's timeout.
  beat.on_job_stopped = [rank = env.rank](const std::string& why) {
    log_error("rank ", rank, " ends: ", dist::kJobStoppedBy, why, " (reported through the store)");
    dist::dump_installed_flight_recorder();
    std::raise(SIGTERM);
  };
  dist.liveness =
      dist::Liveness::start(dist.store, static_cast<int>(env.rank),
                            static_cast<int>(env.world_size), where_this_rank_runs(env), beat);
  return dist;
}

void finalize_distributed(DistributedContext& dist, const CommSection& comm) {
  if (!dist.store) return;
  if (dist.liveness) dist.liveness->stop();
  // Past start-up, so the training timeout bounds this as it bounds every collective.
  const std::chrono::milliseconds timeout(comm.train_timeout_seconds * 1000);
  dist.store->setTimeout(timeout + kVerdictGrace);
  dist.store->set(exited_key(dist.rank()), bytes("1"));
  dist.store->add(kExited, 1);
  if (dist.rank() == 0 && !dist.env.agent_store) {
    const auto start = Clock::now();
    int64_t exited = 0;
    while ((exited = dist.store->add(kExited, 0)) < dist.world_size() &&
           Clock::now() < start + timeout) {
      std::this_thread::sleep_for(kPoll);
    }
    if (exited < dist.world_size()) {
      const std::string missing = missing_ranks(*dist.store, dist.world_size(), exited_key);
      const auto waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
      dist.store.reset();
      throw dist::CommError("exit barrier: " + std::to_string(exited) + " of " +
                            std::to_string(dist.world_size()) + " ranks finished; " +
                            (missing.empty() ? "some ranks" : missing) + " did not arrive within " +
                            seconds(waited) + " (comm.train_timeout_seconds " + seconds(timeout) +
                            "). HINT: those ranks hang, were stopped or died after their last "
                            "collective; this rank's outputs are complete, check theirs");
    }
  }
  dist.store.reset();
}

int64_t rank_num_threads(int64_t configured, const LaunchEnv& env, const EnvLookup& lookup) {
  if (configured > 0) return configured;
  if (!env.distributed()) return 0;
  if (auto omp = lookup("OMP_NUM_THREADS")) {
    try {
      size_t pos = 0;
      const int64_t n = std::stoll(*omp, &pos);
      if (pos == omp->size() && n > 0 && n <= kMaxNumThreads) return n;
    } catch (const std::exception&) {
    }
    throw ConfigError(message("OMP_NUM_THREADS='", *omp, "' is not a positive integer of at most ",
                              kMaxNumThreads,
                              " (threads per rank); unset it or set training.num_threads"));
  }
  return 0;
}

dist::GroupOptions world_group_options(const DistributedContext& dist, const CommSection& comm,
                                       const std::string& fingerprint, const at::Device& device) {
  dist::GroupOptions options;
  options.name = "world";
  // The shared-device test mode: several ranks on one GPU, which NCCL refuses; Gloo moves host
  // copies of the CUDA tensors instead.
  const bool shared = device.is_cuda() && shared_device_mode();
  options.backend = device.is_cuda() && !shared ? dist::Backend::kNccl : dist::Backend::kGloo;
  options.stage_cuda_tensors = shared;
  options.timeout = std::chrono::milliseconds(comm.init_timeout_seconds * 1000);
  options.fingerprint = fingerprint;
  const std::string& addr = dist.env.master_addr;
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (addr == "127.0.0.1" || addr == "localhost") {
    options.gloo_hostname = "127.0.0.1";
  } else if (ifname == nullptr || *ifname == '\0') {
    // Bind where the route to the master leaves this host: the host name may resolve to a
    // loopback address (a container's or a network namespace's /etc/hosts), which the other
    // nodes cannot reach. A loopback route with several nodes keeps Gloo's host-name default.
    const std::string local = address_towards(addr, dist.env.master_port);
    const bool loopback = local.rfind("127.", 0) == 0 || local == "::1";
    if (!loopback || dist.env.world_size == dist.env.local_world_size) {
      options.gloo_hostname = local;
    }
  } else if (options.backend == dist::Backend::kGloo) {
    check_socket_ifnames(ifname, dist.env);
  }
  if (dist.liveness) options.diagnose = dist.liveness->diagnoser();
  return options;
}

std::shared_ptr<dist::FlightRecorder> start_flight_recorder(const CommSection& comm,
                                                            const std::string& dump_folder,
                                                            int64_t rank, int64_t world_size) {
  if (comm.trace_buf_size <= 0) return nullptr;
  // As every folder key under the dump folder (TorchTitan's os.path.join): an absolute
  // comm.save_traces_folder is used as given.
  const std::string path = (std::filesystem::path(dump_folder) / comm.save_traces_folder /
                            (comm.save_traces_file_prefix + std::to_string(rank) + ".json"))
                               .string();
  auto recorder = std::make_shared<dist::FlightRecorder>(
      comm.trace_buf_size, path, static_cast<int>(rank), static_cast<int>(world_size));
  dist::install_dump_on_sigusr1(recorder);
  return recorder;
}

}  // namespace titan
