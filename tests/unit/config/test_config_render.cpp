// --help text, --job.print_config TOML (and its round trip), nearest_name, and list-valued keys
// (exercised on a small config of the test's own, since JobConfig has no list key yet).
#include "titan/config/config_manager.h"
#include "titan/config/config_sources.h"
#include "titan/config/field_table.h"

#include "config_test_util.h"

#include <cstdio>
#include <sstream>

namespace titan {
namespace test_config_render {

using config_test::config_error;
using config_test::contains;
using config_test::TempDir;

// Section names and full key names of a config, straight from its visit functions.
struct NameLister {
  std::vector<std::string> sections;
  std::vector<std::string> keys;
  std::string current;

  template <class Section>
  void section(const char* name, Section& section) {
    sections.push_back(name);
    current = name;
    section.visit(*this);
  }
  template <class T>
  void operator()(const char* key, T& value, const char* doc, KeySupport = kSupported) {
    keys.push_back(current + "." + key);
  }
};

// Every value of a config as exact text (doubles in hex), to compare two configs field by field.
struct ValueLister {
  std::vector<std::string> values;
  std::string current;

  template <class Section>
  void section(const char* name, Section& section) {
    current = name;
    section.visit(*this);
  }
  void operator()(const char* key, bool& v, const char*, KeySupport = kSupported) {
    add(key, v ? "true" : "false");
  }
  void operator()(const char* key, int64_t& v, const char*, KeySupport = kSupported) {
    add(key, std::to_string(v));
  }
  void operator()(const char* key, double& v, const char*, KeySupport = kSupported) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%a", v);
    add(key, buf);
  }
  void operator()(const char* key, std::string& v, const char*, KeySupport = kSupported) {
    add(key, "'" + v + "'");
  }
  void operator()(const char* key, std::vector<std::string>& v, const char*,
                  KeySupport = kSupported) {
    add(key, quoted(v));
  }
  void operator()(const char* key, std::vector<std::vector<std::string>>& v, const char*,
                  KeySupport = kSupported) {
    std::string joined;
    for (const auto& items : v) {
      joined.append("[").append(quoted(items)).append("] ");
    }
    add(key, joined);
  }
  static std::string quoted(const std::vector<std::string>& items) {
    std::string joined;
    for (const std::string& item : items) {
      joined += "'" + item + "' ";
    }
    return joined;
  }
  void add(const char* key, const std::string& text) {
    values.push_back(current + "." + key + "=" + text);
  }
};

std::vector<std::string> all_values(JobConfig config) {
  ValueLister lister;
  config.visit_sections(lister);
  return lister.values;
}

TEST(ConfigHelp, ListsEverySectionAndKey) {
  std::string help = render_help("train");
  EXPECT_EQ(
      help.rfind("usage: titan train [--job.config_file FILE] [--section.key value ...]\n", 0), 0u)
      << help;
  JobConfig config;
  NameLister names;
  config.visit_sections(names);
  ASSERT_FALSE(names.keys.empty());
  for (const std::string& section : names.sections) {
    EXPECT_TRUE(contains(help, "\n[" + section + "]\n"));
  }
  for (const std::string& key : names.keys) {
    EXPECT_TRUE(contains(help, "\n  --" + key + " <"));
  }
}

TEST(ConfigHelp, ShowsTypesDefaultsAndDescriptionsInAlignedColumns) {
  std::string help = render_help("train");
  EXPECT_TRUE(contains(help, "--job.print_config <bool>"));
  EXPECT_TRUE(contains(help, "--training.steps <int>"));
  EXPECT_TRUE(contains(help, "--optimizer.lr <float>"));
  EXPECT_TRUE(contains(help, "--model.flavor <str>"));
  EXPECT_TRUE(contains(help, "(default: false)"));
  EXPECT_TRUE(contains(help, "(default: 10000)"));
  EXPECT_TRUE(contains(help, "(default: 0.0008)"));
  EXPECT_TRUE(contains(help, "(default: \"./outputs\")"));
  EXPECT_TRUE(contains(help, "(default: -1)"));
  EXPECT_TRUE(contains(help, "Optimizer steps to train (>= 1)"));

  // "(default:" and the description start at the same column on every key line.
  std::istringstream lines(help);
  std::string line;
  size_t default_column = std::string::npos;
  size_t key_lines = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("  --", 0) != 0) {
      continue;
    }
    ++key_lines;
    size_t column = line.find("(default:");
    ASSERT_NE(column, std::string::npos) << line;
    if (default_column == std::string::npos) {
      default_column = column;
    }
    EXPECT_EQ(column, default_column) << line;
  }
  JobConfig config;
  NameLister names;
  config.visit_sections(names);
  EXPECT_EQ(key_lines, names.keys.size());
}

TEST(ConfigPrint, RenderIsTomlWithSectionsInVisitOrder) {
  std::string toml = render_config_toml(JobConfig{});
  JobConfig config;
  NameLister names;
  config.visit_sections(names);
  size_t previous = 0;
  for (const std::string& section : names.sections) {
    size_t at = toml.find("[" + section + "]\n");
    ASSERT_NE(at, std::string::npos) << section;
    EXPECT_GE(at, previous) << section;
    previous = at;
  }
  EXPECT_TRUE(contains(toml, "print_config = false\n"));
  EXPECT_TRUE(contains(toml, "decay_ratio = -1.0\n"));
  EXPECT_TRUE(contains(toml, "lr = 0.0008\n"));
  EXPECT_TRUE(contains(toml, "dump_folder = \"./outputs\"\n"));
}

TEST(ConfigPrint, RoundTripsThroughParse) {
  TempDir dir;
  std::string file = dir.path() + "/printed.toml";
  JobConfig original;
  original.job.config_file = file;  // parsing it back sets this from the command line
  original.job.description = "quote \" backslash \\ tab \t newline \n bell \x07 utf8 \xc3\xa9";
  original.job.print_config = true;
  original.model.flavor = "tiny";
  original.optimizer.lr = 0.1 + 0.2;  // needs all 17 digits
  original.optimizer.eps = 1e-12;
  original.optimizer.weight_decay = 0;
  original.lr_scheduler.decay_ratio = 0.8;
  original.lr_scheduler.min_lr_factor = 1;
  original.lr_scheduler.warmup_steps = 2;
  original.metrics.peak_flops = 989e12;
  original.training.steps = 123456789012;
  original.training.global_batch_size = 64;
  original.training.max_norm = -1;
  original.debug.seed = 42;
  original.validation.enable = true;

  std::string toml = render_config_toml(original);
  dir.write("printed.toml", toml);
  JobConfig parsed = parse_job_config({"--job.config_file", file});
  EXPECT_EQ(all_values(parsed), all_values(original)) << toml;
  EXPECT_EQ(render_config_toml(parsed), toml);

  // The defaults round-trip too.
  JobConfig defaults;
  defaults.job.config_file = file;
  dir.write("printed.toml", render_config_toml(defaults));
  EXPECT_EQ(all_values(parse_job_config({"--job.config_file", file})), all_values(defaults));
}

TEST(ConfigNearestName, PicksSmallestEditDistance) {
  std::vector<std::string> sections = {"job", "metrics", "training", "validation"};
  EXPECT_EQ(nearest_name("trainig", sections), "training");
  EXPECT_EQ(nearest_name("metric", sections), "metrics");
  EXPECT_EQ(nearest_name("validation", sections), "validation");
  EXPECT_EQ(nearest_name("stesp", {"seq_len", "steps", "seed"}), "steps");
  EXPECT_EQ(nearest_name("", {"ab", "a"}), "a");
}

TEST(ConfigNearestName, TieGoesToFirstCandidate) {
  EXPECT_EQ(nearest_name("ab", {"xb", "ay"}), "xb");
  EXPECT_EQ(nearest_name("ab", {"ay", "xb"}), "ay");
  EXPECT_EQ(nearest_name("zzz", {"", "a"}), "");
}

TEST(ConfigNearestName, EmptyCandidatesGiveEmpty) { EXPECT_EQ(nearest_name("anything", {}), ""); }

TEST(ConfigFormat, NumbersAreReadable) {
  EXPECT_EQ(detail::format_number(0.8), "0.8");
  EXPECT_EQ(detail::format_number(0.1 + 0.2), "0.3");
  EXPECT_EQ(detail::format_number(8e-4), "0.0008");
  EXPECT_EQ(detail::format_number(1e-8), "1e-08");
  EXPECT_EQ(detail::format_number(1.5), "1.5");
  EXPECT_EQ(detail::format_number(-1), "-1");
  EXPECT_EQ(detail::format_toml_float(-1), "-1.0");
  EXPECT_EQ(detail::format_toml_float(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(detail::format_toml_float(1e20), "1e+20");
}

// A config with a list key, to exercise list support through the same machinery.
struct DataSection {
  std::vector<std::string> files = {"a.bin", "b.bin"};
  std::vector<std::string> tags;
  bool shuffle = true;

  template <class V>
  void visit(V& v) {
    v("files", files, "Input files");
    v("tags", tags, "Free-form tags");
    v("shuffle", shuffle, "Shuffle the files");
  }
};

struct ListConfig {
  DataSection data;

  template <class V>
  void visit_sections(V& v) {
    v.section("data", data);
  }
};

void apply_command_line(ListConfig& config, const std::vector<std::string>& args) {
  detail::FieldTable table = detail::FieldTable::of(config);
  detail::apply_overrides(detail::parse_overrides(table, args));
}

TEST(ConfigLists, CommaSeparatedOnCommandLine) {
  ListConfig config;
  apply_command_line(config, {"--data.files", "x.bin, y.bin,,z.bin", "--data.tags=solo"});
  EXPECT_EQ(config.data.files, (std::vector<std::string>{"x.bin", "y.bin", "z.bin"}));
  EXPECT_EQ(config.data.tags, (std::vector<std::string>{"solo"}));
  apply_command_line(config, {"--data.files="});
  EXPECT_TRUE(config.data.files.empty());
}

TEST(ConfigLists, TomlArraysAndRoundTrip) {
  TempDir dir;
  ListConfig config;
  detail::FieldTable table = detail::FieldTable::of(config);
  detail::apply_toml_file(table,
                          dir.write("lists.toml", "[data]\nfiles = [\"p\", \"q \\\"r\\\"\"]\n"));
  EXPECT_EQ(config.data.files, (std::vector<std::string>{"p", "q \"r\""}));

  config.data.tags = {"t1", "t2"};
  std::string toml = detail::render_toml(table);
  EXPECT_TRUE(contains(toml, "tags = [\"t1\", \"t2\"]\n")) << toml;
  ListConfig reparsed;
  reparsed.data.files.clear();
  detail::apply_toml_file(detail::FieldTable::of(reparsed), dir.write("again.toml", toml));
  EXPECT_EQ(reparsed.data.files, config.data.files);
  EXPECT_EQ(reparsed.data.tags, config.data.tags);
  EXPECT_EQ(reparsed.data.shuffle, config.data.shuffle);
}

TEST(ConfigLists, WrongTypesAreErrors) {
  TempDir dir;
  ListConfig config;
  detail::FieldTable table = detail::FieldTable::of(config);
  std::string message = config_error([&] {
    detail::apply_toml_file(table, dir.write("bad.toml", "[data]\nfiles = [\"p\", 3]\n"));
  });
  EXPECT_TRUE(contains(message, "config key 'data.files' expects a list of strings, got '3'"));
  message = config_error(
      [&] { detail::apply_toml_file(table, dir.write("bad2.toml", "[data]\nfiles = 7\n")); });
  EXPECT_TRUE(contains(message, "expects a list of strings, got '7' (an integer in TOML file"));
}

// TorchTitan's "list[str] | str" keys (and its older files) give a list as one comma string.
TEST(ConfigLists, TomlStringIsACommaList) {
  TempDir dir;
  ListConfig config;
  detail::apply_toml_file(detail::FieldTable::of(config),
                          dir.write("str.toml", "[data]\nfiles = \"p, q\"\ntags = \"\"\n"));
  EXPECT_EQ(config.data.files, (std::vector<std::string>{"p", "q"}));
  EXPECT_TRUE(config.data.tags.empty());
}

TEST(ConfigLists, HelpShowsCommaList) {
  ListConfig config;
  std::string help = detail::render_help(detail::FieldTable::of(config), "train");
  EXPECT_TRUE(contains(help, "--data.files <list>"));
  EXPECT_TRUE(contains(help, "(default: a.bin,b.bin)"));
  EXPECT_TRUE(contains(help, "(default: none)"));
  EXPECT_TRUE(contains(help, "(default: true)"));
}

}  // namespace test_config_render
}  // namespace titan
