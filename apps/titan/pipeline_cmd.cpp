// `titan pipeline-schedule`: prints the action table of a pipeline schedule (ranks as columns,
// steps as rows, as PyTorch's _format_pipeline_order) and its simulated bubble, for a schedule
// name or a schedule CSV; can write the table as CSV. Bad usage throws ConfigError (exit 2).
#include "commands.h"
#include "flags.h"

#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/parallel/pipeline_schedule.h"
#include "titan/plan/schedule_simulator.h"

#include <algorithm>
#include <cstdio>
#include <fcntl.h>
#include <sstream>
#include <unistd.h>

namespace titan {
namespace {

struct ScheduleOptions {
  std::string schedule = "1F1B";
  bool schedule_given = false;
  int64_t pp = -1;
  int64_t microbatches = -1;
  int64_t stages_per_rank = -1;
  std::string csv;
  std::string dump_csv;
  bool comms = false;
  pp::ActionCosts costs;
};

int64_t positive(const std::string& flag, const std::string& text) {
  const std::optional<int64_t> n = parse_int64(text);
  if (!n || *n < 1)
    throw ConfigError(message(flag, " expects a positive integer, got '", text, "'"));
  return *n;
}

pp::ActionCosts parse_costs(const std::string& text) {
  std::vector<double> values;
  std::stringstream fields(text);
  std::string field;
  while (std::getline(fields, field, ',')) {
    size_t used = 0;
    double v = -1;
    try {
      v = std::stod(field, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != field.size() || !(v >= 0)) {
      throw ConfigError(
          message("--costs expects four non-negative numbers F,B,I,W, got '", text, "'"));
    }
    values.push_back(v);
  }
  if (values.size() != 4) {
    throw ConfigError(message("--costs expects four numbers F,B,I,W, got '", text, "'"));
  }
  pp::ActionCosts costs;
  costs.forward = values[0];
  costs.full_backward = values[1];
  costs.backward_input = values[2];
  costs.backward_weight = values[3];
  return costs;
}

// The flags, writing into `opts`.
FlagTable schedule_flags(ScheduleOptions& opts) {
  FlagTable flags(
      "titan pipeline-schedule --schedule NAME --pp N --microbatches M\n"
      "                               [--stages-per-rank V] [--comms] [--costs F,B,I,W]\n"
      "                               [--dump-csv FILE]\n"
      "       titan pipeline-schedule --csv FILE [--pp N] [--microbatches M] [--comms] ...",
      "Prints the per-rank actions of a pipeline schedule: one column per pp rank, one row per\n"
      "step; \"2F0\" is stage 2's forward of microbatch 0, B a full backward, I / W the backward\n"
      "for inputs / for weights (zero-bubble schedules), (..)OVERLAP_F_B a forward and a backward\n"
      "run together (DualPipeV), SEND_F / RECV_F / SEND_B / RECV_B the transfers, an empty cell an\n"
      "idle step. Then the schedule is simulated under its data dependencies with costs F, B, I, W\n"
      "(default 1,2,1,1) and the bubble (idle share of all ranks' time) printed; for GPipe and\n"
      "1F1B the closed form (p-1)/(m+p-1) too. A table is refused when it deadlocks, or when two\n"
      "ranks would post their messages to each other in different orders (NCCL matches a pair's\n"
      "sends and receives by order, not by tag; a table of compute actions is received in the\n"
      "sender's order, so only explicit SEND / RECV cells can swap). A table holds at most\n"
      "1048576 (stage, microbatch) pairs; larger ones are refused before anything is built.");
  flags
      .value("--schedule", "NAME",
             "GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble,\n"
             "ZBVZeroBubble or DualPipeV (any case), as parallelism.pipeline_parallel_schedule",
             [&opts](const std::string& v) {
               opts.schedule = v;
               opts.schedule_given = true;
             })
      .value("--pp", "N", "pipeline ranks",
             [&opts](const std::string& v) { opts.pp = positive("--pp", v); })
      .value("--microbatches", "M", "microbatches per step",
             [&opts](const std::string& v) { opts.microbatches = positive("--microbatches", v); })
      .value("--stages-per-rank", "V", "default 1 for GPipe / 1F1B, 2 for the others",
             [&opts](const std::string& v) {
               opts.stages_per_rank = positive("--stages-per-rank", v);
             })
      .value("--csv", "FILE",
             "a table in PyTorch's CSV format (one row per rank; what\n"
             "parallelism.pipeline_parallel_schedule_csv takes) instead; --pp and\n"
             "--microbatches are then checked against it (default: its rows, its largest\n"
             "microbatch + 1)",
             [&opts](const std::string& v) { opts.csv = v; })
      .toggle("--comms", "adds the sends and receives PyTorch's runtime would run (_add_send_recv)",
              &opts.comms)
      .value("--costs", "F,B,I,W", "the simulation's action costs (default 1,2,1,1)",
             [&opts](const std::string& v) { opts.costs = parse_costs(v); })
      .value("--dump-csv", "FILE", "writes the printed table in that CSV format",
             [&opts](const std::string& v) { opts.dump_csv = v; });
  return flags;
}

ScheduleOptions parse_schedule_options(const std::vector<std::string>& args) {
  ScheduleOptions opts;
  const FlagTable flags = schedule_flags(opts);
  const std::string usage = flags.usage();
  for (const std::string& extra : flags.parse(args)) {
    throw ConfigError(message("unknown argument '", extra, "'\n", usage));
  }
  if (opts.csv.empty() && (opts.pp < 0 || opts.microbatches < 0)) {
    throw ConfigError(message("--pp and --microbatches are required (or --csv FILE)\n", usage));
  }
  if (!opts.csv.empty() && (opts.schedule_given || opts.stages_per_rank > 0)) {
    throw ConfigError("--csv gives the whole table; drop --schedule / --stages-per-rank");
  }
  return opts;
}

std::string join_ints(const std::vector<int64_t>& values) {
  std::string out;
  for (int64_t v : values) out += (out.empty() ? "" : " ") + std::to_string(v);
  return out;
}

// Stages each rank holds, from the stage -> rank map: "rank 0: 0 7 | rank 1: 1 6".
std::string placement_text(const std::vector<int64_t>& stage_rank, int64_t pp) {
  std::string out;
  for (int64_t r = 0; r < pp; ++r) {
    std::vector<int64_t> stages;
    for (size_t s = 0; s < stage_rank.size(); ++s) {
      if (stage_rank[s] == r) stages.push_back(static_cast<int64_t>(s));
    }
    out +=
        (r > 0 ? " | " : "") + std::string("rank ") + std::to_string(r) + ": " + join_ints(stages);
  }
  return out;
}

std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

void write_text_file(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw ConfigError(message("--dump-csv ", path, ": cannot create the file"));
  write_all(fd, text, path);
  close_checked(fd, path);
}

}  // namespace

int run_pipeline_schedule(const std::vector<std::string>& args) {
  if (std::any_of(args.begin(), args.end(),
                  [](const std::string& a) { return a == "--help" || a == "-h"; })) {
    ScheduleOptions unused;
    std::fputs(schedule_flags(unused).usage().c_str(), stdout);
    return 0;
  }
  const ScheduleOptions opts = parse_schedule_options(args);
  pp::ScheduleTable table;
  std::vector<int64_t> stage_rank;
  std::string title;
  std::optional<pp::ScheduleKind> kind;
  int64_t n_microbatches = opts.microbatches;
  if (opts.csv.empty()) {
    kind = pp::parse_schedule_kind(opts.schedule, "--schedule");
    const int64_t per_rank =
        opts.stages_per_rank > 0 ? opts.stages_per_rank : (pp::is_single_stage(*kind) ? 1 : 2);
    const pp::ScheduleShape shape{opts.pp, per_rank, opts.microbatches};
    table = pp::generate_schedule(*kind, shape);
    stage_rank = pp::stage_to_rank(opts.pp, per_rank, pp::placement_of(*kind));
    title = std::string(pp::schedule_name(*kind)) + ": pp " + std::to_string(opts.pp) + ", " +
            std::to_string(per_rank) + (per_rank == 1 ? " stage" : " stages") + " per rank (" +
            std::to_string(shape.n_stages()) + " stages, " +
            pp::placement_name(pp::placement_of(*kind)) + " placement), " +
            std::to_string(opts.microbatches) + " microbatches";
  } else {
    table = pp::load_schedule_csv(opts.csv);
    const int64_t n_ranks = static_cast<int64_t>(table.size());
    if (opts.pp > 0 && opts.pp != n_ranks) {
      throw ConfigError(message(opts.csv, " has ", n_ranks, " rows (ranks), --pp is ", opts.pp));
    }
    const pp::TableExtent extent = pp::table_extent(table);
    if (n_microbatches < 0) n_microbatches = extent.n_microbatches;
    stage_rank = pp::validate_schedule_table(table, n_ranks, extent.n_stages, n_microbatches);
    title = opts.csv + ": pp " + std::to_string(n_ranks) + ", " + std::to_string(extent.n_stages) +
            " stages, " + std::to_string(n_microbatches) + " microbatches";
  }
  const bool has_comms = std::any_of(table.begin(), table.end(), [](const auto& rank) {
    return std::any_of(rank.begin(), rank.end(),
                       [](const pp::Slot& s) { return s && pp::is_comm(s->kind); });
  });
  if (opts.comms && !has_comms) table = pp::add_send_recv(table, stage_rank);

  std::printf("%s\n", title.c_str());
  std::printf("stages per rank: %s\n\n", placement_text(stage_rank, table.size()).c_str());
  std::fputs(pp::format_schedule_table(table).c_str(), stdout);

  const pp::SimulationResult sim = pp::simulate_schedule(table, opts.costs);
  pp::check_transfer_order(table, stage_rank);
  std::vector<std::string> busy;
  for (double b : sim.busy) busy.push_back(number_text(b));
  std::string busy_text;
  for (const std::string& b : busy) busy_text += (busy_text.empty() ? "" : " ") + b;
  std::printf("\nsimulated with costs F=%s B=%s I=%s W=%s: makespan %s, busy per rank %s\n",
              number_text(opts.costs.forward).c_str(),
              number_text(opts.costs.full_backward).c_str(),
              number_text(opts.costs.backward_input).c_str(),
              number_text(opts.costs.backward_weight).c_str(), number_text(sim.makespan).c_str(),
              busy_text.c_str());
  std::printf("bubble fraction %.4f\n", sim.bubble_fraction());
  if (kind && pp::is_single_stage(*kind)) {
    const int64_t p = opts.pp;
    const int64_t m = n_microbatches;
    std::printf("closed form for GPipe / 1F1B (B = 2F): (p-1)/(m+p-1) = %lld/%lld = %.4f\n",
                static_cast<long long>(p - 1), static_cast<long long>(m + p - 1),
                static_cast<double>(p - 1) / static_cast<double>(m + p - 1));
  }
  if (!opts.dump_csv.empty()) {
    write_text_file(opts.dump_csv, pp::dump_schedule_csv(table));
    std::printf("wrote %s\n", opts.dump_csv.c_str());
  }
  return 0;
}

}  // namespace titan
