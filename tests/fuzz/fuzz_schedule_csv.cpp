// Fuzzes pipeline schedule CSVs (parallelism.pipeline_parallel_schedule_csv, `titan
// pipeline-schedule --csv`): parsing, then what the command and the trainer do with a table
// that parses: validation against its own stage and microbatch counts, the send/recv lowering,
// the transfer-order proof and the simulation (which refuses deadlocks).
#include "fuzz_util.h"

#include "titan/parallel/pipeline_schedule.h"
#include "titan/plan/schedule_simulator.h"

#include <algorithm>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan;
  fuzz::parse_input_file("schedule.csv", data, size, [](const std::string& path) {
    pp::ScheduleTable table = pp::load_schedule_csv(path);
    const auto ranks = static_cast<int64_t>(table.size());
    const pp::TableExtent extent = pp::table_extent(table);
    const std::vector<int64_t> stage_rank =
        pp::validate_schedule_table(table, ranks, extent.n_stages, extent.n_microbatches);
    pp::format_schedule_table(table);
    pp::dump_schedule_csv(table);
    const bool has_comms = std::any_of(table.begin(), table.end(), [](const auto& rank) {
      return std::any_of(rank.begin(), rank.end(),
                         [](const pp::Slot& s) { return s && pp::is_comm(s->kind); });
    });
    if (!has_comms) table = pp::add_send_recv(table, stage_rank);
    pp::check_transfer_order(table, stage_rank);
    pp::simulate_schedule(table, pp::ActionCosts{});
  });
  return 0;
}
