// titan plot's parts: reading metrics rows (validation rows, resume markers, torn and corrupt
// lines, per-rank files), choosing panels (unknown names with the nearest one), tick choice and
// labels, and the SVG itself, parsed back here by a small XML reader: well-formed, one panel per
// metric, one polyline per run with one point per logged step at the right place.
#include "titan/common/check.h"
#include "titan/components/plot.h"

#include "../test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

namespace titan {
namespace test_plot {

namespace fs = std::filesystem;
using test::contains;
using test::message_of;

std::vector<double> values_of(const PlotSeries& s, const std::string& metric) {
  std::vector<double> out;
  for (const PlotPoint& p : s.metrics.at(metric)) out.push_back(p.value);
  return out;
}

std::vector<int64_t> steps_of(const PlotSeries& s, const std::string& metric) {
  std::vector<int64_t> out;
  for (const PlotPoint& p : s.metrics.at(metric)) out.push_back(p.step);
  return out;
}

TEST(PlotRows, TrainingAndValidationRowsBecomeSeriesByMetric) {
  const std::string text =
      R"({"step":1,"loss":5.5,"lr":0.001,"tps":100,"memory_gib":0.5,"elapsed_s":1.0})"
      "\n"
      R"({"step":2,"loss":5.0,"lr":0.002,"tps":200,"memory_gib":0.5,"elapsed_s":2.0})"
      "\n"
      R"({"step":2,"validation_loss":4.9,"validation_perplexity":134.3})"
      "\n\n"
      R"({"step":3,"loss":null,"lr":0.002,"note":"text","flag":true})"
      "\n";
  const PlotSeries s = parse_metrics_rows(text, "m.jsonl", "run a");
  EXPECT_EQ(s.label, "run a");
  EXPECT_EQ(steps_of(s, "loss"), (std::vector<int64_t>{1, 2}));  // null (NaN) is skipped
  EXPECT_EQ(values_of(s, "loss"), (std::vector<double>{5.5, 5.0}));
  EXPECT_EQ(steps_of(s, "lr"), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(steps_of(s, "validation_loss"), (std::vector<int64_t>{2}));
  EXPECT_EQ(s.metrics.count("note"), 0u);
  EXPECT_EQ(s.metrics.count("flag"), 0u);
  EXPECT_EQ(s.metrics.count("step"), 0u);
  EXPECT_EQ(s.torn_last_line, 0);
}

TEST(PlotRows, AResumeMarkerDropsTheRowsPastItsStepSoNoStepIsPlottedTwice) {
  // An interrupted run logged steps 1-4 (and validation at 4); it resumed from the checkpoint of
  // step 2, whose rows 3 and 4 are logged again with other values. Files the trainer resumed
  // hold no rows past the marker's step (it drops them), but older or copied files may.
  const std::string text = R"({"step":1,"loss":6.0})"
                           "\n"
                           R"({"step":2,"loss":5.0})"
                           "\n"
                           R"({"step":3,"loss":4.0})"
                           "\n"
                           R"({"step":4,"loss":3.0})"
                           "\n"
                           R"({"step":4,"validation_loss":3.5})"
                           "\n"
                           R"({"event":"resume","step":2,"dropped_rows":0})"
                           "\n"
                           R"({"step":3,"loss":4.25})"
                           "\n"
                           R"({"step":4,"loss":3.25})"
                           "\n"
                           R"({"step":5,"loss":2.0})"
                           "\n";
  const PlotSeries s = parse_metrics_rows(text, "m.jsonl", "r");
  EXPECT_EQ(steps_of(s, "loss"), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(values_of(s, "loss"), (std::vector<double>{6.0, 5.0, 4.25, 3.25, 2.0}));
  EXPECT_EQ(s.metrics.count("validation_loss"), 0u);  // its only point was past the marker
  EXPECT_EQ(s.metrics.count("dropped_rows"), 0u);

  // A step logged twice without a marker keeps its last value.
  const PlotSeries twice =
      parse_metrics_rows("{\"step\":1,\"loss\":2}\n{\"step\":1,\"loss\":1}\n", "m.jsonl", "r");
  EXPECT_EQ(values_of(twice, "loss"), (std::vector<double>{1.0}));
}

TEST(PlotRows, CorruptLinesNameFileAndLineButATornLastLineIsSkipped) {
  const std::string good = "{\"step\":1,\"loss\":2}\n";
  std::string msg = message_of(
      [&] { parse_metrics_rows(good + "{\"step\":2,\"lo\n" + good, "run/m.jsonl", ""); });
  EXPECT_TRUE(contains(msg, "run/m.jsonl:2: not a JSON object: '{\"step\":2,\"lo'")) << msg;
  msg = message_of([&] { parse_metrics_rows(good + "[1,2]\n", "m.jsonl", ""); });
  EXPECT_TRUE(contains(msg, "m.jsonl:2: not a JSON object")) << msg;
  msg = message_of([&] { parse_metrics_rows(good + "{\"step\":-3,\"loss\":1}\n", "m.jsonl", ""); });
  EXPECT_TRUE(contains(msg, "m.jsonl:2: \"step\" is -3, not a non-negative integer")) << msg;
  msg = message_of([&] { parse_metrics_rows("{\"step\":\"x\"}\n", "m.jsonl", ""); });
  EXPECT_TRUE(contains(msg, "m.jsonl:1: \"step\" is \"x\"")) << msg;
  EXPECT_THROW(parse_metrics_rows("{\"step\":1.5}\n", "m.jsonl", ""), ConfigError);

  // The last row cut short by a kill (no newline) is skipped and reported.
  const PlotSeries torn = parse_metrics_rows(good + "{\"step\":2,\"lo", "m.jsonl", "");
  EXPECT_EQ(torn.torn_last_line, 2);
  EXPECT_EQ(steps_of(torn, "loss"), (std::vector<int64_t>{1}));
}

TEST(PlotRuns, FindsMetricsJsonlOrEveryRanksFileAndExplainsWhatIsMissing) {
  const fs::path dir = test::fresh_test_dir("titan_test_plot_runs");
  test::write_file(dir / "one" / "metrics.jsonl", "{\"step\":1,\"loss\":2}\n");
  test::write_file(dir / "all" / "metrics_rank_10.jsonl", "{\"step\":1,\"loss\":3}\n");
  test::write_file(dir / "all" / "metrics_rank_2.jsonl", "{\"step\":1,\"loss\":4}\n");
  test::write_file(dir / "all" / "notes.txt", "x");
  fs::create_directories(dir / "empty");
  test::write_file(dir / "blank" / "metrics.jsonl", "\n{\"event\":\"resume\",\"step\":0}\n");

  const std::string one = (dir / "one").string();
  std::vector<RunFile> files = run_metrics_files(one, "one");
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].path, (dir / "one" / "metrics.jsonl").string());
  files = run_metrics_files((dir / "all").string(), "all");
  ASSERT_EQ(files.size(), 2u);  // in rank order, not name order
  EXPECT_EQ(files[0].label, "all rank 2");
  EXPECT_EQ(files[1].label, "all rank 10");
  files = run_metrics_files((dir / "all").string(), "all", /*rank=*/10);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].label, "all rank 10");
  files = run_metrics_files((dir / "one" / "metrics.jsonl").string(), "f");
  ASSERT_EQ(files.size(), 1u);

  std::string msg = message_of([&] { run_metrics_files((dir / "nope").string(), "x"); });
  EXPECT_TRUE(contains(msg, "nope' does not exist")) << msg;
  msg = message_of([&] { run_metrics_files((dir / "empty").string(), "x"); });
  EXPECT_TRUE(contains(msg, "no metrics in '" + (dir / "empty").string() +
                                "': it holds neither metrics.jsonl nor metrics_rank_<r>.jsonl"))
      << msg;
  // The parent of runs points at them.
  msg = message_of([&] { run_metrics_files(dir.string(), "x"); });
  EXPECT_TRUE(contains(msg, "HINT: these folders in it hold runs' metrics; plot them: " +
                                (dir / "blank").string() + " " + one))
      << msg;
  msg = message_of([&] { run_metrics_files((dir / "all").string(), "x", /*rank=*/3); });
  EXPECT_TRUE(contains(msg, "nor metrics_rank_3.jsonl")) << msg;
  msg = message_of([&] { run_metrics_files(one, "x", /*rank=*/1); });
  EXPECT_TRUE(contains(msg, "holds rank 0's metrics.jsonl only")) << msg;
  EXPECT_THROW(run_metrics_files("/dev/null", "x"), ConfigError);

  // Loading: labels default to the paths without a trailing '/'; a file without rows is refused.
  const std::vector<PlotSeries> loaded = load_plot_runs({one + "/", (dir / "all").string()}, {});
  ASSERT_EQ(loaded.size(), 3u);
  EXPECT_EQ(loaded[0].label, one);
  EXPECT_EQ(values_of(loaded[2], "loss"), (std::vector<double>{3.0}));
  EXPECT_EQ(load_plot_runs({one}, {"mine"})[0].label, "mine");
  msg = message_of([&] { load_plot_runs({(dir / "blank").string()}, {}); });
  EXPECT_TRUE(contains(msg, "no metrics in " + (dir / "blank" / "metrics.jsonl").string())) << msg;
  fs::remove_all(dir);
}

PlotSeries series_with(const std::string& label, const std::vector<std::string>& metrics) {
  PlotSeries s;
  s.label = label;
  for (const std::string& m : metrics) s.metrics[m] = {{1, 1.0}};
  return s;
}

TEST(PlotPanels, DefaultsPresentAllAndUnknownNamesWithTheNearest) {
  const std::vector<PlotSeries> runs = {series_with("a", {"loss", "lr", "grad_norm", "mfu"}),
                                        series_with("b", {"loss", "validation_loss"})};
  EXPECT_EQ(choose_plot_metrics(runs, {}),
            (std::vector<std::string>{"loss", "validation_loss", "lr"}));
  EXPECT_EQ(choose_plot_metrics(runs, {"all"}),
            (std::vector<std::string>{"loss", "validation_loss", "lr", "grad_norm", "mfu"}));
  EXPECT_EQ(choose_plot_metrics(runs, {"mfu", "loss", "mfu"}),
            (std::vector<std::string>{"mfu", "loss"}));
  const std::string msg = message_of([&] { choose_plot_metrics(runs, {"loss", "grad_nrom"}); });
  EXPECT_TRUE(contains(msg,
                       "unknown metric 'grad_nrom'; did you mean 'grad_norm'? (the runs "
                       "have: grad_norm, loss, lr, mfu, validation_loss, or all)"))
      << msg;
  // None of the defaults: every metric there is.
  EXPECT_EQ(choose_plot_metrics({series_with("c", {"tflops"})}, {}),
            (std::vector<std::string>{"tflops"}));
}

TEST(PlotTicks, LinearTicksAreOneTwoOrFiveTimesAPowerOfTenAndCoverTheData) {
  AxisTicks t = linear_ticks(0, 10);
  EXPECT_EQ(t.spacing, 2.0);
  EXPECT_EQ(t.values, (std::vector<double>{0, 2, 4, 6, 8, 10}));
  t = linear_ticks(5.2, 10.9);
  EXPECT_EQ(t.spacing, 1.0);
  EXPECT_EQ(t.lo, 5.0);
  EXPECT_EQ(t.hi, 11.0);
  EXPECT_EQ(t.values.size(), 7u);
  t = linear_ticks(1, 300, /*target=*/6, /*integer=*/true);
  EXPECT_EQ(t.spacing, 50.0);
  EXPECT_EQ(t.lo, 0.0);
  EXPECT_EQ(t.hi, 300.0);
  t = linear_ticks(1, 3, /*target=*/6, /*integer=*/true);  // steps never get fractional ticks
  EXPECT_EQ(t.spacing, 1.0);
  EXPECT_EQ(t.values, (std::vector<double>{1, 2, 3}));
  t = linear_ticks(0.0002, 0.00118);
  EXPECT_DOUBLE_EQ(t.spacing, 2e-4);
  EXPECT_DOUBLE_EQ(t.lo, 2e-4);
  EXPECT_DOUBLE_EQ(t.hi, 1.2e-3);
  t = linear_ticks(4, 4, 5, /*integer=*/true);  // one step: centred
  EXPECT_LT(t.lo, 4.0);
  EXPECT_GT(t.hi, 4.0);
  t = linear_ticks(0, 0);
  EXPECT_LT(t.lo, 0.0);
  EXPECT_GT(t.hi, 0.0);
  for (double lo : {-3.7, 0.0, 0.013, 57.0, 12345.0}) {
    for (double span : {0.01, 1.0, 7.3, 950.0, 2e6}) {
      const AxisTicks a = linear_ticks(lo, lo + span);
      EXPECT_LE(a.lo, lo);
      EXPECT_GE(a.hi, lo + span);
      EXPECT_GE(a.values.size(), 3u) << lo << " " << span;
      EXPECT_LE(a.values.size(), 12u) << lo << " " << span;
      const double mantissa = a.spacing / std::pow(10.0, std::floor(std::log10(a.spacing) + 1e-9));
      EXPECT_TRUE(std::abs(mantissa - 1) < 1e-9 || std::abs(mantissa - 2) < 1e-9 ||
                  std::abs(mantissa - 5) < 1e-9)
          << a.spacing;
    }
  }
}

TEST(PlotTicks, LogTicksWidenToNiceEndsWithAtLeastThreeTicks) {
  AxisTicks t = log_ticks(5.2, 10.9);
  EXPECT_EQ(t.lo, 5.0);
  EXPECT_EQ(t.hi, 20.0);
  EXPECT_EQ(t.values, (std::vector<double>{5, 10, 20}));
  t = log_ticks(0.03, 250);
  EXPECT_DOUBLE_EQ(t.lo, 0.02);
  EXPECT_EQ(t.hi, 500.0);
  ASSERT_EQ(t.values.size(), 4u);  // 0.1, 1, 10, 100 fall inside; decades suffice
  EXPECT_DOUBLE_EQ(t.values[0], 0.1);
  t = log_ticks(3.1, 3.9);  // within one 1-2-5 interval: 1..9 multiples
  EXPECT_EQ(t.lo, 2.0);
  EXPECT_EQ(t.hi, 5.0);
  EXPECT_EQ(t.values, (std::vector<double>{2, 3, 4, 5}));
  EXPECT_THROW(log_ticks(0, 1), c10::Error);
}

TEST(PlotTicks, LabelsShowWhatTheSpacingResolves) {
  EXPECT_EQ(format_tick(0, 2), "0");
  EXPECT_EQ(format_tick(10, 2), "10");
  EXPECT_EQ(format_tick(5.5, 0.5), "5.5");
  EXPECT_EQ(format_tick(6, 0.5), "6.0");
  EXPECT_EQ(format_tick(0.25, 0.05), "0.25");
  EXPECT_EQ(format_tick(12000, 2000), "12k");
  EXPECT_EQ(format_tick(1500, 500), "1500");
  EXPECT_EQ(format_tick(2.5e6, 5e5), "2.5M");
  EXPECT_EQ(format_tick(3e9, 1e9), "3G");
  EXPECT_EQ(format_tick(5e-4, 5e-4), "5e-4");
  EXPECT_EQ(format_tick(1.5e-3, 5e-4), "1.5e-3");
  EXPECT_EQ(format_tick(1e-3, 5e-4), "1e-3");
  EXPECT_EQ(format_tick(0.30000000000000004, 0.1), "0.3");
  EXPECT_EQ(format_tick(-2e-4, 1e-4), "-2e-4");
  // Small steps on an axis of larger values stay fixed-point.
  EXPECT_EQ(format_tick(0.3915, 5e-5, /*axis_max=*/0.392), "0.39150");
  EXPECT_EQ(format_tick(0.0005, 5e-4, /*axis_max=*/0.002), "5e-4");
}

// ---------------------------------------------------------------------------------------------
// A small XML reader for the SVG: elements with attributes and text, entities decoded; throws on
// anything not well-formed (unbalanced or crossed tags, bad attributes, stray '<' or '&').

struct Element {
  std::string name;
  std::map<std::string, std::string> attrs;
  std::string text;
  std::vector<Element> children;

  std::vector<const Element*> find_all(const std::string& tag, const std::string& cls = "") const {
    std::vector<const Element*> out;
    for (const Element& c : children) {
      if (c.name == tag && (cls.empty() || (c.attrs.count("class") && c.attrs.at("class") == cls)))
        out.push_back(&c);
      for (const Element* e : c.find_all(tag, cls)) out.push_back(e);
    }
    return out;
  }
  std::string all_text() const {
    std::string out = text;
    for (const Element& c : children) out += c.all_text();
    return out;
  }
};

class XmlReader {
 public:
  explicit XmlReader(const std::string& s) : s_(s) {}

  Element document() {
    skip_space();
    if (s_.compare(pos_, 5, "<?xml") == 0) pos_ = must_find("?>") + 2;
    skip_space();
    Element root = element();
    skip_space();
    if (pos_ != s_.size()) fail("content after the root element");
    return root;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("XML: " + what + " at offset " + std::to_string(pos_));
  }
  size_t must_find(const std::string& what) const {
    const size_t at = s_.find(what, pos_);
    if (at == std::string::npos) fail("missing " + what);
    return at;
  }
  void skip_space() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  std::string name() {
    const size_t start = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) ||
                                s_[pos_] == '-' || s_[pos_] == '_' || s_[pos_] == ':')) {
      ++pos_;
    }
    if (pos_ == start) fail("expected a name");
    return s_.substr(start, pos_ - start);
  }
  std::string decode(const std::string& raw) const {
    std::string out;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '<') fail("'<' in text or attribute");
      if (raw[i] != '&') {
        out += raw[i];
        continue;
      }
      static const std::map<std::string, char> kEntities = {
          {"amp", '&'}, {"lt", '<'}, {"gt", '>'}, {"quot", '"'}, {"apos", '\''}};
      const size_t end = raw.find(';', i);
      if (end == std::string::npos || !kEntities.count(raw.substr(i + 1, end - i - 1)))
        fail("bad entity");
      out += kEntities.at(raw.substr(i + 1, end - i - 1));
      i = end;
    }
    return out;
  }
  Element element() {
    if (s_[pos_] != '<') fail("expected '<'");
    ++pos_;
    Element e;
    e.name = name();
    while (true) {
      skip_space();
      if (s_.compare(pos_, 2, "/>") == 0) {
        pos_ += 2;
        return e;
      }
      if (s_[pos_] == '>') {
        ++pos_;
        break;
      }
      const std::string key = name();
      if (s_[pos_] != '=' || s_[pos_ + 1] != '"') fail("attribute " + key + " without =\"");
      pos_ += 2;
      const size_t end = must_find("\"");
      if (e.attrs.count(key)) fail("attribute " + key + " twice");
      e.attrs[key] = decode(s_.substr(pos_, end - pos_));
      pos_ = end + 1;
    }
    while (true) {
      const size_t lt = must_find("<");
      e.text += decode(s_.substr(pos_, lt - pos_));
      pos_ = lt;
      if (s_.compare(pos_, 2, "</") == 0) {
        pos_ += 2;
        if (name() != e.name) fail("closing tag does not match <" + e.name + ">");
        if (s_[pos_] != '>') fail("expected '>'");
        ++pos_;
        return e;
      }
      e.children.push_back(element());
    }
  }

  const std::string& s_;
  size_t pos_ = 0;
};

std::vector<double> numbers(const std::string& text) {
  std::vector<double> out;
  std::istringstream in(text);
  for (double v; in >> v;) out.push_back(v);
  return out;
}

std::vector<std::pair<double, double>> points_of(const Element& polyline) {
  std::vector<std::pair<double, double>> out;
  std::istringstream in(polyline.attrs.at("points"));
  for (std::string xy; in >> xy;) {
    const size_t comma = xy.find(',');
    out.push_back({std::stod(xy.substr(0, comma)), std::stod(xy.substr(comma + 1))});
  }
  return out;
}

PlotSeries make_series(const std::string& label, int64_t steps, double loss0, double val0) {
  PlotSeries s;
  s.label = label;
  s.path = label + "/metrics.jsonl";
  for (int64_t step = 1; step <= steps; ++step) {
    s.metrics["loss"].push_back({step, loss0 / static_cast<double>(step)});
    s.metrics["lr"].push_back({step, 1e-3 * static_cast<double>(step) / steps});
    if (step % 5 == 0) s.metrics["validation_loss"].push_back({step, val0 - 0.1 * step});
  }
  return s;
}

TEST(PlotSvg, PanelsPolylinesAndLegendReadBackFromTheDocument) {
  const std::vector<PlotSeries> runs = {make_series("base <&> \"run\"", 20, 8.0, 7.0),
                                        make_series("other", 12, 6.0, 5.5)};
  PlotOptions options;
  options.metrics = {"loss", "validation_loss", "lr"};
  options.log_loss = true;
  options.title = "compare";
  const std::string svg = render_plot_svg(runs, options);
  const Element root = XmlReader(svg).document();
  EXPECT_EQ(root.name, "svg");
  EXPECT_EQ(root.attrs.at("xmlns"), "http://www.w3.org/2000/svg");

  // The legend names each run once, escaped on the way in and decoded back here.
  const auto legend = root.find_all("g", "legend-entry");
  ASSERT_EQ(legend.size(), 2u);
  EXPECT_EQ(legend[0]->all_text(), "base <&> \"run\"");
  EXPECT_EQ(legend[1]->all_text(), "other");
  EXPECT_EQ(root.find_all("text", "title").at(0)->text, "compare");

  const auto panels = root.find_all("g", "panel");
  ASSERT_EQ(panels.size(), 3u);
  std::map<std::string, std::string> colour;  // label -> stroke, the same in every panel
  for (const Element* panel : panels) {
    const std::string metric = panel->attrs.at("data-metric");
    const bool log = panel->attrs.at("data-scale") == "log";
    EXPECT_EQ(log, metric != "lr") << metric;
    const std::vector<double> xd = numbers(panel->attrs.at("data-x-domain"));
    const std::vector<double> yd = numbers(panel->attrs.at("data-y-domain"));
    EXPECT_EQ(xd, (std::vector<double>{0, 20}));  // one step axis for all panels
    const Element* area = panel->find_all("rect", "plot-area").at(0);
    const double ax = std::stod(area->attrs.at("x")), ay = std::stod(area->attrs.at("y"));
    const double aw = std::stod(area->attrs.at("width")), ah = std::stod(area->attrs.at("height"));
    // Axes: tick labels on both, "step" under x, the metric's name on y.
    EXPECT_GE(panel->find_all("text", "tick-label").size(), 6u);
    const auto axis_labels = panel->find_all("text", "axis-label");
    ASSERT_EQ(axis_labels.size(), 2u);
    EXPECT_EQ(axis_labels[0]->text, "step");
    EXPECT_EQ(axis_labels[1]->text, metric);

    const auto lines = panel->find_all("polyline", "series");
    ASSERT_EQ(lines.size(), 2u) << metric;
    for (size_t i = 0; i < lines.size(); ++i) {
      const PlotSeries& run = runs[i];
      EXPECT_EQ(lines[i]->attrs.at("data-label"), run.label);
      if (colour.count(run.label) > 0) {
        EXPECT_EQ(colour[run.label], lines[i]->attrs.at("stroke"));
      }
      colour[run.label] = lines[i]->attrs.at("stroke");
      const std::vector<PlotPoint>& want = run.metrics.at(metric);
      const auto got = points_of(*lines[i]);
      ASSERT_EQ(got.size(), want.size()) << metric << " " << run.label;
      for (size_t k = 0; k < got.size(); ++k) {
        const double step = xd[0] + (got[k].first - ax) / aw * (xd[1] - xd[0]);
        const double u = (ay + ah - got[k].second) / ah;  // 0 at the bottom, 1 at the top
        const double value =
            log ? std::pow(10.0, std::log10(yd[0]) + u * (std::log10(yd[1]) - std::log10(yd[0])))
                : yd[0] + u * (yd[1] - yd[0]);
        EXPECT_NEAR(step, static_cast<double>(want[k].step), 1e-3);
        const double tol = log ? 1e-4 * want[k].value : 1e-4 * (yd[1] - yd[0]);
        EXPECT_NEAR(value, want[k].value, tol) << metric << " step " << want[k].step;
      }
    }
  }
  EXPECT_NE(colour["other"], colour[runs[0].label]);
}

TEST(PlotSvg, ARunWithoutAMetricIsLeftOutOfThatPanelOnly) {
  PlotSeries a = make_series("a", 10, 5.0, 4.0);
  PlotSeries b = make_series("b", 10, 5.0, 4.0);
  b.metrics.erase("validation_loss");
  PlotOptions options;
  options.metrics = {"validation_loss", "loss"};
  const Element root = XmlReader(render_plot_svg({a, b}, options)).document();
  const auto panels = root.find_all("g", "panel");
  ASSERT_EQ(panels.size(), 2u);
  EXPECT_EQ(panels[0]->find_all("polyline", "series").size(), 1u);
  EXPECT_EQ(panels[1]->find_all("polyline", "series").size(), 2u);
  // Loss on a linear scale without --log-loss; a one-point series still shows (a dot).
  EXPECT_EQ(panels[1]->attrs.at("data-scale"), "linear");
  PlotSeries one;
  one.label = "one";
  one.metrics["loss"] = {{3, 2.5}};
  options.metrics = {"loss"};
  const Element single = XmlReader(render_plot_svg({one}, options)).document();
  EXPECT_EQ(single.find_all("circle").size(), 1u);
}

// Losses of +-1e308 (a diverged run) used to give NaN coordinates: the difference of the range
// ends overflowed. Every coordinate of the document is a finite number.
TEST(PlotSvg, ValuesAtTheEndsOfTheDoubleRangeGiveFiniteCoordinates) {
  PlotSeries wild;
  wild.label = "wild";
  wild.metrics["loss"] = {{1, -1e308}, {2, 1e308}, {3, 1.7e308}, {4, 0.5}};
  PlotSeries flat;
  flat.label = "flat";
  flat.metrics["loss"] = {{1, 1.7e308}, {2, 1.7e308}};
  PlotOptions options;
  options.metrics = {"loss"};
  for (const auto& runs : {std::vector<PlotSeries>{wild}, std::vector<PlotSeries>{flat}}) {
    const std::string svg = render_plot_svg(runs, options);
    EXPECT_EQ(svg.find("nan"), std::string::npos) << svg.substr(0, 2000);
    EXPECT_EQ(svg.find("inf"), std::string::npos) << svg.substr(0, 2000);
    const Element root = XmlReader(svg).document();
    for (const Element* line : root.find_all("polyline", "series")) {
      for (const auto& [x, y] : points_of(*line)) {
        EXPECT_TRUE(std::isfinite(x) && std::isfinite(y)) << x << "," << y;
      }
    }
  }
}

TEST(PlotSvg, TheReaderRejectsMalformedDocuments) {
  EXPECT_THROW(XmlReader("<a><b></a></b>").document(), std::runtime_error);
  EXPECT_THROW(XmlReader("<a x=\"1\" x=\"2\"/>").document(), std::runtime_error);
  EXPECT_THROW(XmlReader("<a>&nbsp;</a>").document(), std::runtime_error);
  EXPECT_THROW(XmlReader("<a></a><b/>").document(), std::runtime_error);
  EXPECT_EQ(XmlReader("<a t=\"&lt;\">x<b/>y</a>").document().attrs.at("t"), "<");
}

}  // namespace test_plot
}  // namespace titan
