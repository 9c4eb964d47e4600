// The "rng" checkpoint entry: the CPU generator of rank 0 and every rank's accelerator generator,
// with the rules for checkpoints saved on another device or by another number of ranks.
#include "titan/checkpoint/rng_state.h"

#include "titan/common/check.h"
#include "titan/common/logging.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <algorithm>
#include <mutex>

namespace titan::ckpt {

namespace {

at::Tensor state_of(const at::Generator& gen) {
  at::Generator g = gen;
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}

void set_state(at::Generator& gen, const at::Tensor& state, const CheckpointReader& reader,
               const std::string& name) {
  try {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  } catch (const c10::Error& e) {
    throw DataError("checkpoint '" + reader.dir() + "': '" + name + "' (" +
                    std::to_string(state.numel()) + " bytes) is no state of this generator (" +
                    e.what_without_backtrace() + ")");
  }
}

// The device states in the checkpoint: names "rng.<kind>.<n>", any kind.
std::vector<std::string> device_state_names(const CheckpointReader& reader) {
  std::vector<std::string> out;
  for (const std::string& name : reader.names()) {
    if (name.rfind("rng.", 0) == 0 && name != cpu_rng_name()) out.push_back(name);
  }
  return out;
}

}  // namespace

RankGenerators rank_generators(const at::Device& device) {
  RankGenerators gens{at::detail::getDefaultCPUGenerator(), std::nullopt, "cuda"};
  if (!device.is_cpu()) {
    gens.device = at::globalContext().defaultGenerator(device);
    gens.device_kind = c10::DeviceTypeName(device.type(), /*lower_case=*/true);
  }
  return gens;
}

std::string cpu_rng_name() { return "rng.cpu"; }

std::string device_rng_name(const std::string& kind, int64_t rank) {
  return "rng." + kind + "." + std::to_string(rank);
}

void save_rng_states(const RankGenerators& gens, int64_t rank, int64_t world_size,
                     std::vector<SavedTensor>& tensors, nlohmann::json& state) {
  if (rank == 0) {
    tensors.push_back({cpu_rng_name(), state_of(gens.cpu), {}});
    // All ranks train on the same kind of device (the job config is the same on every rank).
    state["world_size"] = world_size;
    state["device"] = gens.device ? gens.device_kind : "cpu";
  }
  if (gens.device) {
    tensors.push_back({device_rng_name(gens.device_kind, rank), state_of(*gens.device), {}});
  }
}

RngRestore load_rng_states(const CheckpointReader& reader, const nlohmann::json& state,
                           int64_t rank, int64_t world_size, RankGenerators& gens) {
  RngRestore done;
  if (reader.has(cpu_rng_name())) {
    set_state(gens.cpu, reader.read(cpu_rng_name()), reader, cpu_rng_name());
    done.cpu = true;
  } else {
    log_warning("checkpoint ", reader.dir(), " holds no CPU generator state (", cpu_rng_name(),
                "); keeping the seeded one");
  }
  const int64_t saved_world = state.value("world_size", int64_t{-1});
  if (rank == 0 && saved_world > 0 && saved_world != world_size) {
    log_warning("checkpoint ", reader.dir(), " was saved by ", saved_world,
                " ranks and is resumed by ", world_size, ": rank r restores the generator rank r ",
                "saved where there is one, so random draws differ from the saving run's");
  }
  const std::vector<std::string> saved = device_state_names(reader);
  done.device_states_ignored = static_cast<int64_t>(saved.size());
  if (!gens.device) {
    if (rank == 0 && !saved.empty()) {
      log_info("checkpoint ", reader.dir(), " holds ", saved.size(),
               " accelerator generator state(s) (", saved.front(),
               ", ...); this run trains on the CPU and does not use them");
    }
    return done;
  }
  const std::string mine = device_rng_name(gens.device_kind, rank);
  if (reader.has(mine)) {
    set_state(*gens.device, reader.read(mine), reader, mine);
    done.device = true;
    --done.device_states_ignored;
    return done;
  }
  const bool any_of_kind = std::any_of(saved.begin(), saved.end(), [&](const std::string& n) {
    return n.rfind("rng." + gens.device_kind + ".", 0) == 0;
  });
  if (!any_of_kind) {
    if (rank == 0) {
      log_info("checkpoint ", reader.dir(), " holds no ", gens.device_kind,
               " generator states (saved on ", state.value("device", std::string("cpu")), "); the ",
               gens.device_kind, " generators keep their start-up seeding");
    }
  } else {
    log_warning("checkpoint ", reader.dir(), " holds no ", mine, " (saved by ", saved_world,
                " ranks); this rank's ", gens.device_kind, " generator keeps its start-up seeding");
  }
  return done;
}

StateEntry rng_entry(RankGenerators gens, int64_t rank, int64_t world_size) {
  StateEntry e;
  e.name = "rng";
  e.save = [gens, rank, world_size](std::vector<SavedTensor>& tensors, nlohmann::json& state) {
    save_rng_states(gens, rank, world_size, tensors, state);
  };
  e.load = [gens, rank, world_size](const CheckpointReader& reader,
                                    const nlohmann::json& state) mutable {
    load_rng_states(reader, state, rank, world_size, gens);
  };
  return e;
}

}  // namespace titan::ckpt
