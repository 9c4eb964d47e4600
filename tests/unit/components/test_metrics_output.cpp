// Outputs are checked: a full disk (/dev/full fails every write with ENOSPC) under metrics.jsonl
// or any other output ends in a DataError naming the file and the errno text, never in a silent
// loss; a resumed run drops the rows an interrupted run logged past its checkpoint and marks the
// resume, so every step appears once.
#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/components/metrics.h"

#include "../test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace titan {
namespace metrics_output_test {

namespace fs = std::filesystem;
using test::contains;
using test::message_of;

MetricsSection quiet_metrics() {
  MetricsSection cfg;
  cfg.log_freq = 1;
  cfg.disable_color_printing = true;
  return cfg;
}

std::vector<nlohmann::json> rows_of(const fs::path& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> rows;
  std::string line;
  while (std::getline(in, line)) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

TEST(OutputFiles, WriteAllReportsAFullDiskWithTheErrno) {
  const int fd = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const std::string msg = message_of([&] { write_all(fd, "row\n", "/x/metrics.jsonl"); });
  ::close(fd);
  EXPECT_TRUE(contains(msg, "/x/metrics.jsonl: cannot write: No space left on device")) << msg;
}

TEST(OutputFiles, ReplaceFileSwapsTheWholeFileAndLeavesNoTemporary) {
  const auto dir = test::fresh_test_dir("titan_test_replace");
  const std::string path = (dir / "out.json").string();
  replace_file(path, "old");
  replace_file(path, "new content");
  std::ifstream in(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "new content");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  EXPECT_THROW(replace_file((dir / "missing" / "x").string(), "x"), DataError);
  fs::remove_all(dir);
}

TEST(MetricsOutput, AFullDiskEndsTheRunNamingTheFile) {
  // Before: the rows went into a failed stream and the run ended with exit 0.
  const auto dir = test::fresh_test_dir("titan_test_metrics_full");
  fs::create_symlink("/dev/full", dir / "metrics.jsonl");
  MetricsLogger logger(quiet_metrics(), dir.string(), 1e6, 1e12, /*total_steps=*/2, true);
  std::string msg;
  try {
    logger.on_step(1, 100, [&] { return LoggedValues{2.5, 0.5, 1e-3}; });
  } catch (const DataError& e) {
    msg = e.what();
  }
  EXPECT_TRUE(contains(msg, (dir / "metrics.jsonl").string() + ": cannot write: No space left"))
      << msg;
  EXPECT_THROW(logger.log_validation(1, 2.0, 10, 0.1), DataError);
  fs::remove_all(dir);
}

TEST(MetricsOutput, AResumeDropsRowsPastTheCheckpointAndMarksItself) {
  const auto dir = test::fresh_test_dir("titan_test_metrics_resume");
  {  // an interrupted run: steps 1..5 and a validation at 4, then a line torn by the kill
    MetricsLogger first(quiet_metrics(), dir.string(), 1e6, 1e12, /*total_steps=*/10, true);
    for (int64_t step = 1; step <= 5; ++step) {
      first.on_step(step, 100, [&] { return LoggedValues{2.0, 0.5, 1e-3}; });
      if (step == 4) first.log_validation(4, 1.5, 10, 0.1);
    }
    first.close();
  }
  {
    std::ofstream torn(dir / "metrics.jsonl", std::ios::app);
    torn << "{\"step\":6,\"lo";
  }
  // Resumed from the checkpoint of step 3: steps 4, 5, the validation and the torn line go.
  MetricsLogger second(quiet_metrics(), dir.string(), 1e6, 1e12, /*total_steps=*/10, true,
                       /*start_step=*/3);
  second.on_step(4, 100, [&] { return LoggedValues{1.0, 0.5, 1e-3}; });
  second.close();
  const std::vector<nlohmann::json> rows = rows_of(dir / "metrics.jsonl");
  ASSERT_EQ(rows.size(), 5u);
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(rows[i]["step"], i + 1);
  EXPECT_EQ(rows[3], (nlohmann::json{{"event", "resume"}, {"step", 3}, {"dropped_rows", 4}}));
  EXPECT_EQ(rows[4]["step"], 4);
  EXPECT_DOUBLE_EQ(rows[4]["loss"].get<double>(), 1.0);
  // Nothing left behind by the atomic rewrite.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
  fs::remove_all(dir);
}

TEST(MetricsOutput, DroppingRowsLeavesMissingAndSpecialFilesAlone) {
  const auto dir = test::fresh_test_dir("titan_test_metrics_drop");
  EXPECT_EQ(drop_metrics_rows_after((dir / "none.jsonl").string(), 3), 0);
  EXPECT_EQ(drop_metrics_rows_after("/dev/null", 3), 0);
  fs::remove_all(dir);
}

}  // namespace metrics_output_test
}  // namespace titan
