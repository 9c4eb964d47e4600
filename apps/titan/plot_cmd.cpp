// `titan plot`: one SVG of several runs' metrics (loss, validation loss, lr, tokens/s, memory,
// ... against steps), overlaid so they compare at a glance. The reading and drawing live in
// src/titan/components/plot.{h,cpp}; this file is the command line. Bad usage, a missing run, a
// run without metrics, an unknown metric and a corrupt metrics line exit 2.
#include "commands.h"

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

constexpr const char* kUsage =
    "usage: titan plot RUN [RUN ...] [--out FILE.svg] [--metrics NAME,NAME,...] [--log-loss]\n"
    "                  [--labels LABEL,LABEL,...] [--rank R] [--title TEXT]\n"
    "\n"
    "Draws the metrics of one or more training runs into one self-contained SVG: a grid of\n"
    "panels against steps, each run's line in its own colour, a legend naming the runs.\n"
    "\n"
    "  RUN               a run's job.dump_folder (its metrics.jsonl, or with\n"
    "                    metrics.save_for_all_ranks every metrics_rank_<r>.jsonl, one line a\n"
    "                    rank), or a metrics .jsonl file. A resumed run's steps appear once.\n"
    "  --out FILE.svg    the file to write (default plot.svg); - writes to standard output\n"
    "  --metrics NAMES   the panels, comma-separated: any field of the rows (loss,\n"
    "                    validation_loss, lr, tps, memory_gib, grad_norm, mfu, tflops, ...), or\n"
    "                    all; default: loss, validation_loss, lr, tps, memory_gib (those present)\n"
    "  --log-loss        log scale for loss, validation_loss and validation_perplexity\n"
    "  --labels LABELS   the legend's names of the runs, comma-separated, one a run (default:\n"
    "                    the paths as given)\n"
    "  --rank R          only rank R's metrics of runs saved for all ranks\n"
    "  --title TEXT      a title above the legend\n";

struct Options {
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
    if (item.empty()) throw ConfigError(flag + " has an empty name in '" + text + "'");
    items.push_back(item);
  }
  if (items.empty()) throw ConfigError(flag + " needs at least one name");
  return items;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

Options parse_options(const std::vector<std::string>& args) {
  Options opts;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw ConfigError(a + " needs a value\n" + kUsage);
      return args[++i];
    };
    if (a == "--out") {
      opts.out = value();
    } else if (a == "--metrics") {
      opts.metrics = split_commas(a, value());
    } else if (a == "--labels") {
      opts.labels = split_commas(a, value());
    } else if (a == "--log-loss") {
      opts.log_loss = true;
    } else if (a == "--rank") {
      const std::string text = value();
      const std::optional<int64_t> r = parse_int64(text);
      if (!r || *r < 0) throw ConfigError("--rank expects a rank >= 0, got '" + text + "'");
      opts.rank = *r;
    } else if (a == "--title") {
      opts.title = value();
    } else if (a.size() > 1 && a[0] == '-') {
      throw ConfigError("unknown argument '" + a + "'\n" + kUsage);
    } else {
      opts.runs.push_back(a);
    }
  }
  if (opts.runs.empty()) throw ConfigError(std::string("no run to plot\n") + kUsage);
  if (!opts.labels.empty() && opts.labels.size() != opts.runs.size()) {
    throw ConfigError("--labels names " + std::to_string(opts.labels.size()) + " runs, " +
                      std::to_string(opts.runs.size()) + " are given");
  }
  const std::string ext = lower(std::filesystem::path(opts.out).extension().string());
  if (opts.out != "-" && ext != ".svg") {
    throw ConfigError("--out " + opts.out + ": titan plot writes SVG, name a .svg file" +
                      (ext == ".png" ? ". HINT: for a PNG convert the SVG, e.g. rsvg-convert "
                                       "plot.svg -o plot.png"
                                     : ""));
  }
  if (opts.out != "-") {
    const std::filesystem::path parent = std::filesystem::path(opts.out).parent_path();
    if (!parent.empty() && !std::filesystem::is_directory(parent)) {
      throw ConfigError("--out " + opts.out + ": folder " + parent.string() + " does not exist");
    }
  }
  return opts;
}

}  // namespace

int run_plot(const std::vector<std::string>& args) {
  if (std::any_of(args.begin(), args.end(),
                  [](const std::string& a) { return a == "--help" || a == "-h"; })) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const Options opts = parse_options(args);
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
