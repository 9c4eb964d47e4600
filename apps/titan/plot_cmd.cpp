// `titan plot`: one SVG of several runs' metrics (loss, validation loss, lr, tokens/s, memory,
// ... against steps), overlaid so they compare at a glance. The reading and drawing live in
// src/titan/components/plot.{h,cpp}; this file is the command line. Bad usage, a missing run, a
// run without metrics, an unknown metric and a corrupt metrics line exit 2.
#include "commands.h"
#include "flags.h"

#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/components/plot.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <sstream>

namespace titan {
namespace {

struct PlotCmdOptions {
  std::vector<std::string> runs;
  std::string out = "plot.svg";
  std::vector<std::string> metrics;
  std::vector<std::string> labels;
  bool log_loss = false;
  int64_t rank = -1;
  std::string title;
};

std::vector<std::string> split_commas(const std::string& flag, const std::string& text) {
  std::vector<std::string> items;
  std::stringstream fields(text);
  std::string item;
  while (std::getline(fields, item, ',')) {
    if (item.empty()) throw ConfigError(message(flag, " has an empty name in '", text, "'"));
    items.push_back(item);
  }
  if (items.empty()) throw ConfigError(message(flag, " needs at least one name"));
  return items;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// The flags, writing into `opts`.
FlagTable plot_flags(PlotCmdOptions& opts) {
  FlagTable flags(
      "titan plot RUN [RUN ...] [--out FILE.svg] [--metrics NAME,NAME,...] [--log-loss]\n"
      "                  [--labels LABEL,LABEL,...] [--rank R] [--title TEXT]",
      "Draws the metrics of one or more training runs into one self-contained SVG: a grid of\n"
      "panels against steps, each run's line in its own colour, a legend naming the runs.");
  flags
      .positional("RUN",
                  "a run's job.dump_folder (its metrics.jsonl, or with\n"
                  "metrics.save_for_all_ranks every metrics_rank_<r>.jsonl, one line a\n"
                  "rank), or a metrics .jsonl file. A resumed run's steps appear once.")
      .value("--out", "FILE.svg",
             "the file to write (default plot.svg); - writes to standard output",
             [&opts](const std::string& v) { opts.out = v; })
      .value("--metrics", "NAMES",
             "the panels, comma-separated: any field of the rows (loss,\n"
             "validation_loss, lr, tps, memory_gib, grad_norm, mfu, tflops, ...), or\n"
             "all; default: loss, validation_loss, lr, tps, memory_gib (those present)",
             [&opts](const std::string& v) { opts.metrics = split_commas("--metrics", v); })
      .toggle("--log-loss", "log scale for loss, validation_loss and validation_perplexity",
              &opts.log_loss)
      .value("--labels", "LABELS",
             "the legend's names of the runs, comma-separated, one a run (default:\n"
             "the paths as given)",
             [&opts](const std::string& v) { opts.labels = split_commas("--labels", v); })
      .value("--rank", "R", "only rank R's metrics of runs saved for all ranks",
             [&opts](const std::string& v) {
               const std::optional<int64_t> r = parse_int64(v);
               TITAN_CONFIG_CHECK(r && *r >= 0, "--rank expects a rank >= 0, got '", v, "'");
               opts.rank = *r;
             })
      .value("--title", "TEXT", "a title above the legend",
             [&opts](const std::string& v) { opts.title = v; });
  return flags;
}

PlotCmdOptions parse_plot_options(const std::vector<std::string>& args) {
  PlotCmdOptions opts;
  const FlagTable flags = plot_flags(opts);
  opts.runs = flags.parse(args);
  const std::string usage = flags.usage();
  if (opts.runs.empty()) throw ConfigError(message("no run to plot\n", usage));
  if (!opts.labels.empty() && opts.labels.size() != opts.runs.size()) {
    throw ConfigError(
        message("--labels names ", opts.labels.size(), " runs, ", opts.runs.size(), " are given"));
  }
  const std::string ext = lower(std::filesystem::path(opts.out).extension().string());
  if (opts.out != "-" && ext != ".svg") {
    throw ConfigError(
        message("--out ", opts.out, ": titan plot writes SVG, name a .svg file",
                (ext == ".png" ? ". HINT: for a PNG convert the SVG, e.g. rsvg-convert "
                                 "plot.svg -o plot.png"
                               : "")));
  }
  if (opts.out != "-") {
    const std::filesystem::path parent = std::filesystem::path(opts.out).parent_path();
    if (!parent.empty() && !std::filesystem::is_directory(parent)) {
      throw ConfigError(
          message("--out ", opts.out, ": folder ", parent.string(), " does not exist"));
    }
  }
  return opts;
}

}  // namespace

int run_plot(const std::vector<std::string>& args) {
  if (std::any_of(args.begin(), args.end(),
                  [](const std::string& a) { return a == "--help" || a == "-h"; })) {
    PlotCmdOptions unused;
    std::fputs(plot_flags(unused).usage().c_str(), stdout);
    return 0;
  }
  const PlotCmdOptions opts = parse_plot_options(args);
  const std::vector<PlotSeries> series = load_plot_runs(opts.runs, opts.labels, opts.rank);
  PlotOptions plot;
  plot.metrics = choose_plot_metrics(series, opts.metrics);
  plot.log_loss = opts.log_loss;
  plot.title = opts.title;
  const std::string svg = render_plot_svg(series, plot);

  std::string panels;
  for (const std::string& m : plot.metrics) panels += (panels.empty() ? "" : ", ") + m;
  const std::string summary = std::to_string(series.size()) +
                              (series.size() == 1 ? " line" : " lines") + ", panels " + panels;
  if (opts.out == "-") {
    std::fputs(svg.c_str(), stdout);
    std::fprintf(stderr, "plotted %s\n", summary.c_str());
  } else {
    replace_file(opts.out, svg);
    std::printf("wrote %s: %s\n", opts.out.c_str(), summary.c_str());
  }
  return 0;
}

}  // namespace titan
