// Plots of training metrics, so a user can look at a run rather than read it: the rows of
// metrics.jsonl files (metrics.h has their format) become one series per metric, and several runs
// are drawn overlaid in one self-contained SVG, a grid of panels (loss, validation loss, lr,
// tokens/s, memory, ... against steps) with axes, ticks and a legend. `titan plot`
// (apps/titan/plot_cmd.cpp) is the command around it.
//
// The SVG is meant to be read back by tests as well as by eyes: each panel is a
// <g class="panel" data-metric=NAME data-scale="linear|log" data-x-domain="LO HI"
// data-y-domain="LO HI"> holding a <rect class="plot-area">, and each run's line in it is a
// <polyline class="series" data-label=LABEL points="x,y ..."> with one point per logged step,
// in panel coordinates: x = area.x + (step - LO) / (HI - LO) * area.width, y from the top of the
// area (log10 of the values on a log scale).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace titan {

struct PlotPoint {
  int64_t step = 0;
  double value = 0.0;
};

// One line of the plot: the rows of one metrics file.
struct PlotSeries {
  std::string label;  // the legend's text
  std::string path;   // the file read
  // By metric name ("loss", "validation_loss", "lr", ...), sorted by step, one point a step.
  std::map<std::string, std::vector<PlotPoint>> metrics;
  // Line number of a last line that was cut short (no newline, not JSON: a run killed while
  // writing it) and skipped; 0 when none.
  int64_t torn_last_line = 0;
};

// Parses the text of a metrics file (`path` only names it in errors): every numeric field of a
// row other than "step" is a point of the metric of that name at that step (non-numeric fields
// and null values, which is how NaN is written, are skipped). A resume marker
// {"event": "resume", "step": S} drops the points after step S read so far (an interrupted run's
// rows, which the resumed run logs again), and a step logged twice keeps its last value, so no
// step is plotted twice. Other "event" rows and rows without "step" are ignored. Throws ConfigError
// "<path>:<line>: ..." for a line that is not a JSON object or whose "step" is not a non-negative
// integer, except a torn last line (see torn_last_line).
PlotSeries parse_metrics_rows(const std::string& text, const std::string& path,
                              const std::string& label);

// The metrics files of a run, each with its legend label: `run` itself when it is a file;
// otherwise <run>/metrics.jsonl, or else every <run>/metrics_rank_<r>.jsonl in rank order
// (metrics.save_for_all_ranks), labelled "<label> rank <r>". `rank` >= 0 keeps only that rank's
// file (metrics.jsonl is rank 0's). ConfigError (with a HINT) when `run` does not exist, holds no
// metrics file, or has none of that rank.
struct RunFile {
  std::string path;
  std::string label;
};
std::vector<RunFile> run_metrics_files(const std::string& run, const std::string& label,
                                       int64_t rank = -1);

// Reads every file of every run (labels default to the paths as given, without a trailing '/').
// ConfigError for a missing run, an unreadable or corrupt file, or a file without metric rows.
std::vector<PlotSeries> load_plot_runs(const std::vector<std::string>& runs,
                                       const std::vector<std::string>& labels, int64_t rank = -1);

// The panels drawn when none are named, in this order, those present in any series:
// loss, validation_loss, lr, tps, memory_gib.
const std::vector<std::string>& default_plot_metrics();

// The panels for `requested` metric names (empty: the defaults present, or every metric when
// none is; "all": every metric of the series, the defaults first). ConfigError for a name no series
// has, naming the nearest one and the names there are.
std::vector<std::string> choose_plot_metrics(const std::vector<PlotSeries>& series,
                                             const std::vector<std::string>& requested);

// An axis: its domain [lo, hi] and the tick positions in it, `spacing` apart (linear), or the
// 1-2-5 (or 1..9) multiples of powers of ten inside it (log).
struct AxisTicks {
  double lo = 0.0;
  double hi = 1.0;
  double spacing = 1.0;
  std::vector<double> values;
};

// About `target` ticks at 1, 2 or 5 times a power of ten covering [lo, hi], the domain widened
// to whole ticks; `integer` keeps the spacing >= 1 (steps). A flat range (lo == hi) is padded.
AxisTicks linear_ticks(double lo, double hi, int target = 5, bool integer = false);
// A log axis over [lo, hi] (both > 0): the domain widened to 1, 2 or 5 times a power of ten, and
// at least 3 ticks where the range allows.
AxisTicks log_ticks(double lo, double hi);
// A tick label: fixed decimals enough for `spacing` ("0.5", "12", "0.3915"), a k/M/G suffix
// for thousands and up ("12k"), powers of ten on an axis of small values, whose largest magnitude
// `axis_max` is under 0.01 ("5e-4", "1.5e-3"; `axis_max` <= 0: |value|).
std::string format_tick(double value, double spacing, double axis_max = 0.0);

struct PlotOptions {
  std::vector<std::string> metrics;  // the panels, in order (choose_plot_metrics)
  bool log_loss = false;  // log scale for loss, validation_loss and validation_perplexity
  std::string title;      // drawn above the legend when not empty
};

// The SVG document: a title, a legend naming each series in its colour, and one panel per metric
// with every series that has it (steps on x, shared by all panels).
std::string render_plot_svg(const std::vector<PlotSeries>& series, const PlotOptions& options);

// `text` with &, <, >, " and ' escaped for XML text and attribute values.
std::string xml_escape(const std::string& text);

}  // namespace titan
