// Stage counts, per-stage module FQNs and the validated pipeline layout (see pipeline_split.h).
#include "titan/plan/pipeline_split.h"

#include "titan/common/check.h"
#include "titan/common/names.h"
#include "titan/plan/schedule_simulator.h"

#include <algorithm>
#include <map>

namespace titan::pp {
namespace {

constexpr const char* kLayersPerStage = "parallelism.pipeline_parallel_layers_per_stage";
constexpr const char* kFqns = "parallelism.module_fqns_per_model_part";

// "8 layers + 1 + 1": the effective layers TorchTitan spreads over the stages.
std::string effective(int64_t n_layers, int64_t first_less, int64_t last_less) {
  return message(n_layers, " layers + ", first_less, " (embedding) + ", last_less,
                 " (norm + output)");
}

// The modules of a Llama in order: tok_embeddings, layers.0 .. layers.{n-1}, norm, output.
std::vector<std::string> llama_modules(int64_t n_layers) {
  std::vector<std::string> names = {"tok_embeddings"};
  for (int64_t i = 0; i < n_layers; ++i) names.push_back(message("layers.", i));
  names.emplace_back("norm");
  names.emplace_back("output");
  return names;
}

}  // namespace

int64_t pipeline_stages_per_rank(ScheduleKind kind, int64_t pp, int64_t n_layers,
                                 int64_t layers_per_stage, int64_t first_less, int64_t last_less) {
  const std::string name = schedule_name(kind);
  if (pp < 1)
    throw ConfigError(message("parallelism.pipeline_parallel_degree must be >= 1, got ", pp));
  if (layers_per_stage == -1) return is_single_stage(kind) ? 1 : 2;
  if (layers_per_stage < 1) {
    throw ConfigError(
        message(kLayersPerStage, " must be >= 1, or -1 to infer it; got ", layers_per_stage));
  }
  const int64_t total = n_layers + first_less + last_less;
  const int64_t n_stages = (total + layers_per_stage - 1) / layers_per_stage;
  const std::string arithmetic = message(kLayersPerStage, " = ", layers_per_stage, " gives ceil((",
                                         effective(n_layers, first_less, last_less), ") / ",
                                         layers_per_stage, ") = ", n_stages, " stages");
  if (n_stages % pp != 0) {
    throw ConfigError(
        message(arithmetic, ", not a multiple of pipeline_parallel_degree ", pp, " (", n_stages,
                " % ", pp, " = ", n_stages % pp,
                "). HINT: pick layers_per_stage so the stages divide among the ranks"));
  }
  const int64_t per_rank = n_stages / pp;
  const std::string spread = message(arithmetic, " over ", pp, " ranks = ", per_rank, " per rank");
  if (is_single_stage(kind) && per_rank != 1) {
    throw ConfigError(message(name, " runs one stage per rank, but ", spread,
                              ". HINT: raise it to ", (total + pp - 1) / pp,
                              " or more, leave it -1, or use a multi-stage schedule such as "
                              "Interleaved1F1B"));
  }
  if (!is_single_stage(kind) && per_rank < 2) {
    throw ConfigError(message(name, " needs at least 2 stages per rank, but ", spread,
                              ". HINT: lower it, or use 1F1B / GPipe for one stage per rank"));
  }
  if (placement_of(kind) == StagePlacement::kV && per_rank != 2) {
    throw ConfigError(message(name, " runs exactly 2 stages per rank (V placement), but ", spread));
  }
  return per_rank;
}

std::vector<std::vector<std::string>> generate_llm_fqns_per_stage(int64_t n_stages,
                                                                  int64_t n_layers,
                                                                  int64_t input_weight,
                                                                  int64_t output_weight) {
  if (n_stages < 1) throw ConfigError(message("a pipeline needs at least 1 stage, got ", n_stages));
  if (input_weight < 0 || output_weight < 0) {
    throw ConfigError(message("parallelism.pipeline_parallel_first_stage_less_layers (",
                              input_weight, ") and pipeline_parallel_last_stage_less_layers (",
                              output_weight, ") must be >= 0"));
  }
  if (n_stages == 1) return {llama_modules(n_layers)};
  const int64_t total = n_layers + input_weight + output_weight;
  const std::string spread = message(effective(n_layers, input_weight, output_weight), " = ", total,
                                     " over ", n_stages, " stages");
  if (n_stages > total) {
    throw ConfigError(message("more pipeline stages than layers: ", spread,
                              ". HINT: fewer stages (pipeline_parallel_degree, layers_per_stage)"));
  }
  const int64_t per_stage = total / n_stages;
  const int64_t extra = total % n_stages;  // the first `extra` stages take one more
  if (input_weight > per_stage || output_weight > per_stage) {
    throw ConfigError(message("the embedding / output weights (", input_weight, ", ", output_weight,
                              ") exceed the ", per_stage, " layers per stage of ", spread,
                              ". HINT: lower pipeline_parallel_first_stage_less_layers / "
                              "pipeline_parallel_last_stage_less_layers"));
  }
  std::vector<std::vector<std::string>> stages;
  int64_t layer = 0;
  const auto take = [&](std::vector<std::string>& modules, int64_t count) {
    for (int64_t i = 0; i < count && layer < n_layers; ++i) {
      modules.push_back(message("layers.", layer++));
    }
  };
  for (int64_t s = 0; s < n_stages; ++s) {
    const int64_t size = per_stage + (s < extra ? 1 : 0);
    std::vector<std::string> modules;
    if (s == 0) {
      modules.emplace_back("tok_embeddings");
      take(modules, size - input_weight);
    } else if (s == n_stages - 1) {
      take(modules, size - output_weight);
      modules.emplace_back("norm");
      modules.emplace_back("output");
    } else {
      take(modules, size);
    }
    stages.push_back(std::move(modules));
  }
  if (layer < n_layers) {
    throw ConfigError(message("the stage split leaves layers.", layer, " .. layers.", n_layers - 1,
                              " without a stage (", spread, ")"));
  }
  return stages;
}

void check_module_fqns(const std::vector<std::vector<std::string>>& parts, int64_t n_layers,
                       int64_t n_stages) {
  if (static_cast<int64_t>(parts.size()) != n_stages) {
    throw ConfigError(message(kFqns, " has ", static_cast<int64_t>(parts.size()),
                              " parts, the pipeline has ", n_stages, " stages"));
  }
  const std::vector<std::string> expected = llama_modules(n_layers);
  std::map<std::string, size_t> part_of;  // module -> part that listed it
  size_t k = 0;                           // position in `expected`
  for (size_t p = 0; p < parts.size(); ++p) {
    if (parts[p].empty()) throw ConfigError(message(kFqns, ": part ", p, " is empty"));
    for (const std::string& module : parts[p]) {
      const std::string at = message(kFqns, ": part ", p, " lists '", module, "'");
      if (std::find(expected.begin(), expected.end(), module) == expected.end()) {
        throw ConfigError(message(at, ", which the model (", n_layers, " layers) does not have",
                                  did_you_mean(nearest_name(module, expected))));
      }
      if (part_of.count(module)) {
        throw ConfigError(message(at, " again (part ", part_of.at(module),
                                  " has it); each module belongs to one part"));
      }
      if (module != expected[k]) {
        throw ConfigError(
            message(at, " where '", expected[k],
                    "' comes next; parts list the modules in model order (tok_embeddings, "
                    "layers.0 .. layers.",
                    n_layers - 1, ", norm, output)"));
      }
      part_of[module] = p;
      ++k;
    }
  }
  if (k < expected.size()) {
    throw ConfigError(message(kFqns, " leaves out '", expected[k],
                              "' (and what follows it); every module needs a part"));
  }
}

int64_t pipeline_microbatches(int64_t local_batch_size, int64_t microbatch_size) {
  if (microbatch_size < 1) {
    throw ConfigError(message("parallelism.pipeline_parallel_microbatch_size must be >= 1, got ",
                              microbatch_size));
  }
  if (local_batch_size < 1 || local_batch_size % microbatch_size != 0) {
    throw ConfigError(message(
        "training.local_batch_size ", local_batch_size,
        " is not a multiple of parallelism.pipeline_parallel_microbatch_size ", microbatch_size,
        " (", local_batch_size, " % ", microbatch_size, " = ", local_batch_size % microbatch_size,
        "). HINT: make the batch a whole number of microbatches"));
  }
  return local_batch_size / microbatch_size;
}

PipelineLayout validate_pipeline(const ParallelismSection& parallelism, int64_t n_layers,
                                 int64_t local_batch_size) {
  PipelineLayout layout;
  layout.pp = parallelism.pipeline_parallel_degree;
  if (layout.pp < 1) {
    throw ConfigError(
        message("parallelism.pipeline_parallel_degree must be >= 1, got ", layout.pp));
  }
  layout.schedule = parse_schedule_kind(parallelism.pipeline_parallel_schedule);
  layout.placement = placement_of(layout.schedule);
  layout.microbatch_size = parallelism.pipeline_parallel_microbatch_size;
  layout.n_microbatches = pipeline_microbatches(local_batch_size, layout.microbatch_size);
  const int64_t first_less = parallelism.pipeline_parallel_first_stage_less_layers;
  const int64_t last_less = parallelism.pipeline_parallel_last_stage_less_layers;

  const auto& parts = parallelism.module_fqns_per_model_part;
  if (!parts.empty()) {
    const int64_t n_parts = static_cast<int64_t>(parts.size());
    if (n_parts % layout.pp != 0) {
      throw ConfigError(message(kFqns, " has ", n_parts,
                                " parts, not a multiple of pipeline_parallel_degree ", layout.pp));
    }
    layout.stages_per_rank = n_parts / layout.pp;
    const std::string name = schedule_name(layout.schedule);
    if (is_single_stage(layout.schedule) && layout.stages_per_rank != 1) {
      throw ConfigError(message(name, " runs one stage per rank, but ", kFqns, " has ", n_parts,
                                " parts for ", layout.pp, " ranks"));
    }
    if (layout.placement == StagePlacement::kV && layout.stages_per_rank != 2) {
      throw ConfigError(message(name, " runs exactly 2 stages per rank, but ", kFqns, " has ",
                                n_parts, " parts for ", layout.pp, " ranks"));
    }
    check_module_fqns(parts, n_layers, n_parts);
    layout.module_fqns = parts;
  } else {
    layout.stages_per_rank = pipeline_stages_per_rank(
        layout.schedule, layout.pp, n_layers, parallelism.pipeline_parallel_layers_per_stage,
        first_less, last_less);
    layout.module_fqns =
        generate_llm_fqns_per_stage(layout.n_stages(), n_layers, first_less, last_less);
  }
  layout.stage_rank = stage_to_rank(layout.pp, layout.stages_per_rank, layout.placement);
  for (int64_t r = 0; r < layout.pp; ++r) {
    layout.rank_stage_ids.push_back(
        rank_stages(r, layout.pp, layout.stages_per_rank, layout.placement));
  }

  const ScheduleShape shape{layout.pp, layout.stages_per_rank, layout.n_microbatches};
  const std::string& csv = parallelism.pipeline_parallel_schedule_csv;
  if (csv.empty()) {
    layout.table = generate_schedule(layout.schedule, shape);
  } else {
    // As TorchTitan: the table replaces the schedule; the schedule's name still decides the
    // stages per rank and where they sit, so the table must put each stage there.
    layout.from_csv = true;
    layout.table = load_schedule_csv(csv);
    for (size_t r = 0; r < layout.table.size(); ++r) {
      for (size_t step = 0; step < layout.table[r].size(); ++step) {
        const Slot& slot = layout.table[r][step];
        if (slot && !is_compute(slot->kind)) {
          throw ConfigError(message(csv, ": rank ", static_cast<int64_t>(r), ", step ",
                                    static_cast<int64_t>(step), " holds ", slot->str(),
                                    "; a schedule CSV lists compute actions only (F, B, I, W, "
                                    "OVERLAP_F_B), the runtime adds sends and receives"));
        }
      }
    }
    // The stages the table runs against those the config's keys give: a table dumped for another
    // schedule (`titan pipeline-schedule --dump-csv`) is refused naming the keys that disagree.
    const int64_t csv_stages = table_extent(layout.table).n_stages;
    if (csv_stages != layout.n_stages()) {
      throw ConfigError(message(
          csv, " runs ", csv_stages, " stages, but the config gives ", layout.n_stages(),
          ": parallelism.pipeline_parallel_schedule '", schedule_name(layout.schedule), "' places ",
          layout.stages_per_rank, (layout.stages_per_rank == 1 ? " stage" : " stages"),
          " on each of pipeline_parallel_degree ", layout.pp,
          " ranks (with a CSV the schedule key still decides the stages and their placement, as "
          "in TorchTitan). HINT: set pipeline_parallel_schedule to the schedule the CSV was made "
          "for (",
          (csv_stages % layout.pp == 0 && csv_stages / layout.pp == 1
               ? std::string("1F1B or GPipe for one stage per rank")
               : message("a multi-stage one such as Interleaved1F1B, with "
                         "pipeline_parallel_layers_per_stage or module_fqns_per_model_part "
                         "giving ",
                         csv_stages, " stages")),
          ")"));
    }
    const std::vector<int64_t> owner =
        validate_schedule_table(layout.table, layout.pp, layout.n_stages(), layout.n_microbatches);
    for (int64_t s = 0; s < layout.n_stages(); ++s) {
      if (owner[s] != layout.stage_rank[s]) {
        throw ConfigError(message(csv, " runs stage ", s, " on rank ", owner[s], ", but ",
                                  schedule_name(layout.schedule), "'s ",
                                  placement_name(layout.placement), " placement puts it on rank ",
                                  layout.stage_rank[s]));
      }
    }
  }
  // Refused before it runs: a table that deadlocks, or whose messages a pair of ranks would
  // match out of order on NCCL.
  simulate_schedule(layout.table);
  check_transfer_order(layout.table, layout.stage_rank);
  return layout;
}

}  // namespace titan::pp
