// Metrics plots: metrics.jsonl rows -> per-metric series -> one SVG of panels. Plain string
// building, no drawing library: the SVG is a handful of elements per panel.
#include "titan/components/plot.h"

#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/common/logging.h"
#include "titan/common/names.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <regex>
#include <set>
#include <string_view>

namespace titan {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Reading rows

namespace {

std::string excerpt(std::string_view line) {
  constexpr size_t kMax = 60;
  return "'" + std::string(line.substr(0, kMax)) + (line.size() > kMax ? "...'" : "'");
}

bool blank(std::string_view line) {
  return std::all_of(line.begin(), line.end(), [](char c) { return std::isspace(uint8_t(c)); });
}

}  // namespace

PlotSeries parse_metrics_rows(const std::string& text, const std::string& path,
                              const std::string& label) {
  PlotSeries out;
  out.label = label;
  out.path = path;
  std::map<std::string, std::map<int64_t, double>> by_metric;  // metric -> step -> value
  int64_t line_no = 0;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    const bool unterminated = end == std::string::npos;
    if (unterminated) end = text.size();
    const std::string_view line(text.data() + begin, end - begin);
    begin = end + 1;
    ++line_no;
    if (blank(line)) continue;
    const std::string where = path + ":" + std::to_string(line_no) + ": ";
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_discarded() && unterminated) {  // a row cut short by a kill: the run's last words
      out.torn_last_line = line_no;
      break;
    }
    if (row.is_discarded() || !row.is_object()) {
      throw ConfigError(
          message(where, "not a JSON object: ", excerpt(line),
                  ". HINT: every line of a metrics file is one JSON row as titan train "
                  "writes it; remove or repair that line"));
    }
    if (!row.contains("step")) continue;  // not a step's row (none such today)
    const nlohmann::json& step_json = row["step"];
    if (!step_json.is_number_integer() || step_json.get<int64_t>() < 0) {
      throw ConfigError(message(where, "\"step\" is ", step_json.dump(),
                                ", not a non-negative integer: ", excerpt(line)));
    }
    const int64_t step = step_json.get<int64_t>();
    if (row.contains("event")) {
      // A resumed run restarts after its checkpoint's step: what was logged past it is redone.
      if (row["event"] == "resume") {
        for (auto& [name, points] : by_metric) points.erase(points.upper_bound(step), points.end());
      }
      continue;
    }
    for (const auto& [key, value] : row.items()) {
      if (key == "step" || !value.is_number()) continue;
      by_metric[key][step] = value.get<double>();
    }
  }
  for (const auto& [name, points] : by_metric) {
    if (points.empty()) continue;  // every point dropped by a resume marker
    std::vector<PlotPoint>& series = out.metrics[name];
    for (const auto& [step, value] : points) series.push_back({step, value});
  }
  return out;
}

std::vector<RunFile> run_metrics_files(const std::string& run, const std::string& label,
                                       int64_t rank) {
  std::error_code ec;
  const fs::file_status status = fs::status(run, ec);
  if (!fs::exists(status)) {
    throw ConfigError(message("run '", run,
                              "' does not exist. HINT: pass a run's job.dump_folder (holding "
                              "metrics.jsonl) or a metrics .jsonl file"));
  }
  if (!fs::is_directory(status)) {
    const std::string kind = non_regular_file_kind(run);
    if (!kind.empty()) {
      throw ConfigError(message("run '", run, "' is ", kind, ", not a folder or a metrics file"));
    }
    if (rank > 0) {
      throw ConfigError(message("--rank ", rank, ": '", run,
                                "' is one file; name the rank's metrics_rank_<r>.jsonl instead"));
    }
    return {{run, label}};
  }
  const fs::path dir(run);
  if (fs::exists(dir / "metrics.jsonl")) {
    if (rank > 0) {
      throw ConfigError(message("--rank ", rank, ": '", run,
                                "' holds rank 0's metrics.jsonl only. HINT: train with "
                                "--metrics.save_for_all_ranks for every rank's metrics"));
    }
    return {{(dir / "metrics.jsonl").string(), label}};
  }
  static const std::regex kRankFile(R"(metrics_rank_(\d+)\.jsonl)");
  std::vector<std::pair<int64_t, RunFile>> ranked;
  std::vector<std::string> subfolders_with_metrics;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    std::smatch match;
    if (std::regex_match(name, match, kRankFile)) {
      const int64_t r = std::stoll(match[1].str());
      if (rank < 0 || r == rank) {
        ranked.push_back({r, {entry.path().string(), label + " rank " + std::to_string(r)}});
      }
    } else if (entry.is_directory(ec) && fs::exists(entry.path() / "metrics.jsonl")) {
      subfolders_with_metrics.push_back(entry.path().string());
    }
  }
  if (ranked.empty()) {
    std::string hint =
        "HINT: titan train writes them under job.dump_folder once it has logged a step";
    if (!subfolders_with_metrics.empty()) {
      std::sort(subfolders_with_metrics.begin(), subfolders_with_metrics.end());
      hint = "HINT: these folders in it hold runs' metrics; plot them:";
      for (const std::string& s : subfolders_with_metrics) hint += " " + s;
    }
    throw ConfigError(message("no metrics in '", run, "': it holds neither metrics.jsonl nor ",
                              (rank < 0 ? std::string("metrics_rank_<r>.jsonl")
                                        : "metrics_rank_" + std::to_string(rank) + ".jsonl"),
                              ". ", hint));
  }
  std::sort(ranked.begin(), ranked.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<RunFile> files;
  for (auto& [r, file] : ranked) files.push_back(std::move(file));
  return files;
}

std::vector<PlotSeries> load_plot_runs(const std::vector<std::string>& runs,
                                       const std::vector<std::string>& labels, int64_t rank) {
  TITAN_CHECK(labels.empty() || labels.size() == runs.size(), "labels ", labels.size(),
              " for runs ", runs.size());
  std::vector<PlotSeries> series;
  for (size_t i = 0; i < runs.size(); ++i) {
    std::string label = labels.empty() ? runs[i] : labels[i];
    if (labels.empty()) {
      while (label.size() > 1 && label.back() == '/') label.pop_back();
    }
    for (const RunFile& file : run_metrics_files(runs[i], label, rank)) {
      const std::string kind = non_regular_file_kind(file.path);
      if (!kind.empty()) {
        throw ConfigError(
            message("metrics file '", file.path, "' is ", kind, ", not a regular file"));
      }
      PlotSeries s =
          parse_metrics_rows(read_regular_file(file.path, "metrics file"), file.path, file.label);
      if (s.torn_last_line > 0) {
        log_warning(file.path, ":", s.torn_last_line,
                    ": skipped the last line, cut short (a run killed while writing it)");
      }
      if (s.metrics.empty()) {
        throw ConfigError(message("no metrics in ", file.path,
                                  ": no row with a step and a number. HINT: a run writes a row per "
                                  "logged step (metrics.log_freq); did it log one?"));
      }
      series.push_back(std::move(s));
    }
  }
  return series;
}

// ---------------------------------------------------------------------------------------------
// Choosing panels

const std::vector<std::string>& default_plot_metrics() {
  static const std::vector<std::string> kDefaults = {"loss", "validation_loss", "lr", "tps",
                                                     "memory_gib"};
  return kDefaults;
}

std::vector<std::string> choose_plot_metrics(const std::vector<PlotSeries>& series,
                                             const std::vector<std::string>& requested) {
  std::set<std::string> present;
  for (const PlotSeries& s : series) {
    for (const auto& [name, points] : s.metrics) present.insert(name);
  }
  std::vector<std::string> chosen;
  const auto add = [&](const std::string& name) {
    if (std::find(chosen.begin(), chosen.end(), name) == chosen.end()) chosen.push_back(name);
  };
  const bool all = requested.size() == 1 && requested[0] == "all";
  if (requested.empty() || all) {
    for (const std::string& name : default_plot_metrics()) {
      if (present.count(name) > 0) add(name);
    }
    if (all || chosen.empty()) {  // none of the defaults: whatever the rows hold
      for (const std::string& name : present) add(name);
    }
    return chosen;
  }
  const std::vector<std::string> known(present.begin(), present.end());
  for (const std::string& name : requested) {
    if (present.count(name) == 0) {
      std::string names;
      for (const std::string& k : known) names += (names.empty() ? "" : ", ") + k;
      throw ConfigError(message("unknown metric '", name, "'",
                                did_you_mean(nearest_name(name, known)), " (the runs have: ", names,
                                ", or all)"));
    }
    add(name);
  }
  return chosen;
}

// ---------------------------------------------------------------------------------------------
// Axes

AxisTicks linear_ticks(double lo, double hi, int target, bool integer) {
  TITAN_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi && target > 0,
              "linear_ticks: bad range [", lo, ", ", hi, "] or target ", target);
  constexpr double kMax = std::numeric_limits<double>::max();
  if (hi == lo) {  // one value: centre it
    double pad = lo == 0.0 ? 1.0 : std::abs(lo) * 0.1;
    if (integer) pad = std::max(pad, 1.0);
    lo = std::max(lo - pad, -kMax);  // near the ends of the double range, no overflow to inf
    hi = std::min(hi + pad, kMax);
  }
  // Differences of values near +-1e308 overflow; each term divided first does not.
  const double raw = hi / target - lo / target;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / magnitude;
  double spacing = (norm < 1.5 ? 1.0 : norm < 3.0 ? 2.0 : norm < 7.0 ? 5.0 : 10.0) * magnitude;
  if (integer) spacing = std::max(spacing, 1.0);
  AxisTicks t;
  t.spacing = spacing;
  const int64_t first = static_cast<int64_t>(std::floor(lo / spacing + 1e-9));
  const int64_t last = static_cast<int64_t>(std::ceil(hi / spacing - 1e-9));
  t.lo = std::max(static_cast<double>(first) * spacing, -kMax);
  t.hi = std::min(static_cast<double>(last) * spacing, kMax);
  for (int64_t k = first; k <= last; ++k) {
    const double v = static_cast<double>(k) * spacing;
    if (std::isfinite(v)) t.values.push_back(v);
  }
  return t;
}

AxisTicks log_ticks(double lo, double hi) {
  TITAN_CHECK(lo > 0 && hi >= lo && std::isfinite(hi), "log_ticks: bad range [", lo, ", ", hi, "]");
  if (hi == lo) {
    lo /= 1.5;
    hi *= 1.5;
  }
  // Domain ends: the nearest 1, 2 or 5 times a power of ten outside [lo, hi].
  const auto nice = [](double v, bool down) {
    const double decade = std::pow(10.0, std::floor(std::log10(v)));
    const double steps[] = {1.0, 2.0, 5.0, 10.0};
    double best = down ? decade : 10.0 * decade;
    for (double m : steps) {
      const double c = m * decade;
      if (down && c <= v * (1 + 1e-12)) best = c;
      if (!down && c >= v * (1 - 1e-12)) return c;
    }
    return best;
  };
  AxisTicks t;
  t.lo = nice(lo, /*down=*/true);
  t.hi = nice(hi, /*down=*/false);
  const std::vector<std::vector<double>> mantissas = {
      {1.0}, {1.0, 2.0, 5.0}, {1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0}};
  for (const std::vector<double>& set : mantissas) {
    t.values.clear();
    for (int e = static_cast<int>(std::floor(std::log10(t.lo))) - 1;
         e <= static_cast<int>(std::ceil(std::log10(t.hi))); ++e) {
      for (double m : set) {
        const double v = m * std::pow(10.0, e);
        if (v >= t.lo * (1 - 1e-12) && v <= t.hi * (1 + 1e-12)) t.values.push_back(v);
      }
    }
    if (t.values.size() >= 3) break;
  }
  t.spacing = 0.0;  // not evenly spaced
  return t;
}

std::string format_tick(double value, double spacing, double axis_max) {
  char buf[48];
  const double a = std::abs(value);
  if (spacing <= 0) spacing = a;
  if (axis_max <= 0) axis_max = a;
  if (a < spacing * 1e-6 || a == 0.0) return "0";
  if (spacing >= 1e3) {  // 12k, 1.5M, 2G: the unit a tenth of the spacing or less
    const double div = spacing >= 1e8 ? 1e9 : spacing >= 1e5 ? 1e6 : 1e3;
    const char* suffix = div == 1e9 ? "G" : div == 1e6 ? "M" : "k";
    const int decimals =
        std::max(0, static_cast<int>(std::ceil(-std::log10(spacing / div) - 1e-9)));
    std::snprintf(buf, sizeof(buf), "%.*f%s", decimals, value / div, suffix);
    return buf;
  }
  if (spacing >= 1e-3 || axis_max >= 1e-2) {
    const int decimals = std::max(0, static_cast<int>(std::ceil(-std::log10(spacing) - 1e-9)));
    std::snprintf(buf, sizeof(buf), "%.*f", decimals, value);
    return buf;
  }
  // Small values: mantissa e exponent, as many digits as the spacing resolves ("1.5e-3").
  const int exponent = static_cast<int>(std::floor(std::log10(a) + 1e-9));
  const int digits =
      std::max(0, exponent - static_cast<int>(std::floor(std::log10(spacing) + 1e-9)));
  std::snprintf(buf, sizeof(buf), "%.*f", digits, value / std::pow(10.0, exponent));
  std::string mantissa = buf;
  if (mantissa.find('.') != std::string::npos) {
    while (mantissa.back() == '0') mantissa.pop_back();
    if (mantissa.back() == '.') mantissa.pop_back();
  }
  return mantissa + "e" + std::to_string(exponent);
}

// ---------------------------------------------------------------------------------------------
// SVG

std::string xml_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // Control characters other than tab and newlines are not allowed in XML 1.0.
        out += (static_cast<uint8_t>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') ? '?' : c;
    }
  }
  return out;
}

namespace {

// Tableau 10: distinct for the common forms of colour blindness; past 10, dashes tell apart.
constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr const char* kDashes[] = {"", "7 3", "2 2", "7 3 2 3"};
constexpr int kPaletteSize = 10;

// Layout, in pixels. A panel's plot area sits inside it with room for the tick labels.
constexpr double kMargin = 16, kPanelW = 440, kPanelH = 280;
constexpr double kAreaLeft = 72, kAreaRight = 18, kAreaTop = 30, kAreaBottom = 46;
constexpr double kAreaW = kPanelW - kAreaLeft - kAreaRight,
                 kAreaH = kPanelH - kAreaTop - kAreaBottom;
constexpr double kCharW = 7.0;           // average width of a 12 px sans-serif character
constexpr size_t kMaxMarkedPoints = 60;  // series this short also get a dot per point

std::string px(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

std::string exact(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

std::string series_style(size_t i) {
  std::string style = std::string("stroke=\"") + kPalette[i % kPaletteSize] + "\"";
  const char* dash = kDashes[(i / kPaletteSize) % 4];
  if (*dash != '\0') style += std::string(" stroke-dasharray=\"") + dash + "\"";
  return style;
}

std::string metric_title(const std::string& name) {
  static const std::map<std::string, std::string> kTitles = {
      {"loss", "loss"},
      {"validation_loss", "validation loss"},
      {"validation_perplexity", "validation perplexity"},
      {"lr", "learning rate"},
      {"tps", "tokens/s per rank"},
      {"tflops", "TFLOP/s per rank"},
      {"mfu", "MFU (%)"},
      {"memory_gib", "memory (GiB)"},
      {"memory_pct", "memory (% of RAM or device)"},
      {"time_metrics/end_to_end(s)", "step time (s)"},
      {"grad_norm", "gradient norm"},
      {"elapsed_s", "elapsed (s)"},
  };
  const auto it = kTitles.find(name);
  return it == kTitles.end() ? name : it->second;
}

bool loss_like(const std::string& name) {
  return name == "loss" || name == "validation_loss" || name == "validation_perplexity";
}

struct Axis {
  AxisTicks ticks;
  bool log = false;
  double to_unit(double v) const {  // 0 at lo, 1 at hi
    if (log)
      return (std::log10(v) - std::log10(ticks.lo)) / (std::log10(ticks.hi) - std::log10(ticks.lo));
    return (v / 2 - ticks.lo / 2) / (ticks.hi / 2 - ticks.lo / 2);  // halved: no overflow
  }
};

void append_panel(std::string& svg, const std::vector<PlotSeries>& series,
                  const std::string& metric, bool want_log, const Axis& x, double left,
                  double top) {
  double lo = INFINITY, hi = -INFINITY;
  bool positive = true;
  for (const PlotSeries& s : series) {
    const auto it = s.metrics.find(metric);
    if (it == s.metrics.end()) continue;
    for (const PlotPoint& p : it->second) {
      lo = std::min(lo, p.value);
      hi = std::max(hi, p.value);
      positive = positive && p.value > 0;
    }
  }
  if (want_log && !positive) {
    log_warning("plot: ", metric, " has values <= 0; drawn on a linear scale");
  }
  Axis y;
  y.log = want_log && positive;
  y.ticks = y.log ? log_ticks(lo, hi) : linear_ticks(lo, hi);

  const double ax = kAreaLeft, ay = kAreaTop;
  svg += "<g class=\"panel\" data-metric=\"" + xml_escape(metric) + "\" data-scale=\"" +
         (y.log ? "log" : "linear") + "\" data-x-domain=\"" + exact(x.ticks.lo) + " " +
         exact(x.ticks.hi) + "\" data-y-domain=\"" + exact(y.ticks.lo) + " " + exact(y.ticks.hi) +
         "\" transform=\"translate(" + px(left) + "," + px(top) + ")\">\n";
  svg += "<text class=\"panel-title\" x=\"" + px(ax + kAreaW / 2) +
         "\" y=\"18\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\">" +
         xml_escape(metric_title(metric)) + (y.log ? " (log scale)" : "") + "</text>\n";
  svg += "<rect class=\"plot-area\" x=\"" + px(ax) + "\" y=\"" + px(ay) + "\" width=\"" +
         px(kAreaW) + "\" height=\"" + px(kAreaH) + "\" fill=\"#ffffff\" stroke=\"#444444\"/>\n";
  // Ticks, grid lines and labels: x below the area, y to its left.
  svg += "<g class=\"x-ticks\" font-size=\"11\" text-anchor=\"middle\">\n";
  for (double v : x.ticks.values) {
    const double tx = ax + x.to_unit(v) * kAreaW;
    svg += "<line x1=\"" + px(tx) + "\" y1=\"" + px(ay) + "\" x2=\"" + px(tx) + "\" y2=\"" +
           px(ay + kAreaH + 4) + "\" stroke=\"#dddddd\"/>";
    svg += "<text class=\"tick-label\" x=\"" + px(tx) + "\" y=\"" + px(ay + kAreaH + 16) + "\">" +
           format_tick(v, x.ticks.spacing) + "</text>\n";
  }
  svg += "</g>\n<g class=\"y-ticks\" font-size=\"11\" text-anchor=\"end\">\n";
  for (double v : y.ticks.values) {
    const double ty = ay + kAreaH - y.to_unit(v) * kAreaH;
    svg += "<line x1=\"" + px(ax - 4) + "\" y1=\"" + px(ty) + "\" x2=\"" + px(ax + kAreaW) +
           "\" y2=\"" + px(ty) + "\" stroke=\"#dddddd\"/>";
    svg += "<text class=\"tick-label\" x=\"" + px(ax - 6) + "\" y=\"" + px(ty + 4) + "\">" +
           format_tick(v, y.log ? v : y.ticks.spacing,
                       std::max(std::abs(y.ticks.lo), std::abs(y.ticks.hi))) +
           "</text>\n";
  }
  svg += "</g>\n";
  svg += "<text class=\"axis-label\" x=\"" + px(ax + kAreaW / 2) + "\" y=\"" +
         px(ay + kAreaH + 36) + "\" font-size=\"12\" text-anchor=\"middle\">step</text>\n";
  const double label_x = 14, label_y = ay + kAreaH / 2;
  svg += "<text class=\"axis-label\" x=\"" + px(label_x) + "\" y=\"" + px(label_y) +
         "\" font-size=\"12\" text-anchor=\"middle\" transform=\"rotate(-90 " + px(label_x) + " " +
         px(label_y) + ")\">" + xml_escape(metric) + "</text>\n";
  // The series, in legend order.
  for (size_t i = 0; i < series.size(); ++i) {
    const auto it = series[i].metrics.find(metric);
    if (it == series[i].metrics.end()) continue;
    std::string points, dots;
    for (const PlotPoint& p : it->second) {
      const std::string cx = px(ax + x.to_unit(static_cast<double>(p.step)) * kAreaW);
      const std::string cy = px(ay + kAreaH - y.to_unit(p.value) * kAreaH);
      points += (points.empty() ? "" : " ") + cx + "," + cy;
      dots += "<circle cx=\"" + cx + "\" cy=\"" + cy + "\" r=\"2\"/>";
    }
    const std::string label = xml_escape(series[i].label);
    svg += "<polyline class=\"series\" data-series=\"" + std::to_string(i) + "\" data-label=\"" +
           label + "\" fill=\"none\" stroke-width=\"1.5\" " + series_style(i) + " points=\"" +
           points + "\"><title>" + label + "</title></polyline>\n";
    if (it->second.size() <= kMaxMarkedPoints) {
      svg += std::string("<g class=\"markers\" fill=\"") + kPalette[i % kPaletteSize] + "\">" +
             dots + "</g>\n";
    }
  }
  svg += "</g>\n";
}

}  // namespace

std::string render_plot_svg(const std::vector<PlotSeries>& series, const PlotOptions& options) {
  TITAN_CHECK(!series.empty() && !options.metrics.empty(), "render_plot_svg: ", series.size(),
              " series, ", options.metrics.size(), " metrics");
  // Steps: one x axis for every panel, so the panels line up.
  double first = INFINITY, last = -INFINITY;
  for (const PlotSeries& s : series) {
    for (const std::string& metric : options.metrics) {
      const auto it = s.metrics.find(metric);
      if (it == s.metrics.end() || it->second.empty()) continue;
      first = std::min(first, static_cast<double>(it->second.front().step));
      last = std::max(last, static_cast<double>(it->second.back().step));
    }
  }
  TITAN_CHECK(first <= last, "render_plot_svg: no series has the metrics asked for");
  Axis x;
  x.ticks = linear_ticks(first, last, /*target=*/6, /*integer=*/true);

  const size_t n = options.metrics.size();
  const size_t cols = n <= 1 ? 1 : n <= 4 ? 2 : 3;
  const size_t rows = (n + cols - 1) / cols;
  const double width = 2 * kMargin + static_cast<double>(cols) * kPanelW;

  // Header: the title, then the legend flowed into rows.
  std::string header;
  double y = kMargin;
  if (!options.title.empty()) {
    header += "<text class=\"title\" x=\"" + px(width / 2) + "\" y=\"" + px(y + 16) +
              "\" font-size=\"18\" font-weight=\"bold\" text-anchor=\"middle\">" +
              xml_escape(options.title) + "</text>\n";
    y += 28;
  }
  header += "<g class=\"legend\" font-size=\"12\">\n";
  double lx = kMargin;
  for (size_t i = 0; i < series.size(); ++i) {
    const double entry_w = 30 + kCharW * static_cast<double>(series[i].label.size()) + 18;
    if (lx > kMargin && lx + entry_w > width - kMargin) {
      lx = kMargin;
      y += 20;
    }
    header += "<g class=\"legend-entry\" data-series=\"" + std::to_string(i) + "\"><line x1=\"" +
              px(lx) + "\" y1=\"" + px(y + 8) + "\" x2=\"" + px(lx + 24) + "\" y2=\"" + px(y + 8) +
              "\" stroke-width=\"3\" " + series_style(i) + "/><text x=\"" + px(lx + 30) +
              "\" y=\"" + px(y + 12) + "\">" + xml_escape(series[i].label) + "</text></g>\n";
    lx += entry_w;
  }
  header += "</g>\n";
  y += 20 + 8;

  const double height = y + static_cast<double>(rows) * kPanelH + kMargin;
  std::string svg = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" + px(width) +
         "\" height=\"" + px(height) + "\" viewBox=\"0 0 " + px(width) + " " + px(height) +
         "\" font-family=\"sans-serif\">\n";
  svg += "<title>" + xml_escape(options.title.empty() ? "titan plot" : options.title) +
         "</title>\n<desc>";
  for (const PlotSeries& s : series) svg += xml_escape(s.label + ": " + s.path) + "\n";
  svg += "</desc>\n";
  svg += "<rect x=\"0\" y=\"0\" width=\"" + px(width) + "\" height=\"" + px(height) +
         "\" fill=\"#ffffff\"/>\n";
  svg += header;
  for (size_t k = 0; k < n; ++k) {
    const std::string& metric = options.metrics[k];
    const double left = kMargin + static_cast<double>(k % cols) * kPanelW;
    const double top = y + static_cast<double>(k / cols) * kPanelH;
    append_panel(svg, series, metric, options.log_loss && loss_like(metric), x, left, top);
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace titan
