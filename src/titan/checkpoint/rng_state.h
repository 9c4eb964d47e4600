// The random generators a rank draws from, and how their states sit in a checkpoint (the "rng"
// state entry).
//
// Layout: each state is its generator's get_state() bytes (uint8), saved whole (no box):
//   "rng.cpu"            the CPU generator, saved by rank 0 only. Every rank seeds it alike
//                        (debug.seed), and every rank restores rank 0's state.
//   "rng.<kind>.<rank>"  ("rng.cuda.3") the generator of the accelerator that rank <rank> trains
//                        on (its own cuda:LOCAL_RANK), saved by every rank that trains on one.
//                        Keyed by the global rank, not the device index, which repeats on every
//                        node; each rank restores its own.
// The entry's JSON: {"world_size": ranks that saved, "device": "cpu" | "cuda"}.
//
// Loading (TorchTitan checkpoints no RNG state at all: its trainer re-seeds at start-up; we restore
// what we have so that a resumed run draws what an uninterrupted one would):
//   - "rng.cpu" is restored on every rank.
//   - A rank on an accelerator restores "rng.<kind>.<its rank>". When the checkpoint holds no
//     state of that kind (it was saved on CPU), the generator keeps the state start-up seeding gave
//     it (debug.seed, as a fresh run's), and rank 0 logs it. When it holds other ranks' states but
//     not this rank's (saved by fewer ranks), this rank keeps its seeded generator with a warning.
//   - A rank on the CPU ignores accelerator states in the checkpoint (rank 0 logs it): not an
//   error.
//   - A different world size: rank r restores what rank r saved, where there is one (the rules
//     above); states of ranks that no longer exist are unused. Rank 0 warns that the draws then
//     differ from the saving run's (as the data each rank sees does).
//   - checkpoint.exclude_from_loading = ["rng"] skips all of this (the manager never calls load).
#pragma once

#include "titan/checkpoint/checkpoint_manager.h"

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

namespace titan::ckpt {

// The generators of one rank.
struct RankGenerators {
  at::Generator cpu;  // the process's default CPU generator
  // The default generator of the accelerator this rank trains on; none on the CPU.
  std::optional<at::Generator> device;
  std::string device_kind = "cuda";  // names the device state: "rng.<device_kind>.<rank>"
};

// The default generators of a rank training on `device`: the CPU's, plus the device's own when
// `device` is not the CPU.
RankGenerators rank_generators(const at::Device& device);

// "rng.cpu" / "rng.<kind>.<rank>".
std::string cpu_rng_name();
std::string device_rng_name(const std::string& kind, int64_t rank);

// Appends rank `rank`'s states to `tensors` (see the layout above) and, on rank 0, fills `state`.
void save_rng_states(const RankGenerators& gens, int64_t rank, int64_t world_size,
                     std::vector<SavedTensor>& tensors, nlohmann::json& state);

// What load_rng_states did on this rank.
struct RngRestore {
  bool cpu = false;     // the CPU generator was set from "rng.cpu"
  bool device = false;  // the device generator was set from this rank's state
  // Device states in the checkpoint that this rank did not use, none when it restored its own.
  int64_t device_states_ignored = 0;
};

// Restores rank `rank`'s generators from checkpoint `reader` (the entry's JSON: `state`) by the
// rules above. DataError when a state does not fit its generator (a CUDA state given to a CPU
// generator, a truncated state).
RngRestore load_rng_states(const CheckpointReader& reader, const nlohmann::json& state,
                           int64_t rank, int64_t world_size, RankGenerators& gens);

// The "rng" state entry of rank `rank` of `world_size`.
StateEntry rng_entry(RankGenerators gens, int64_t rank, int64_t world_size);

}  // namespace titan::ckpt
