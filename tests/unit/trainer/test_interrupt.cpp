// SIGTERM/SIGINT during training: one line names the interrupted step and the newest complete
// checkpoint (or says there is none), and the process still ends by the signal.
#include "titan/trainer/interrupt.h"

#include "../test_util.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <csignal>
#include <filesystem>

namespace titan {
namespace interrupt_test {

namespace fs = std::filesystem;
using test::contains;

TEST(Interrupt, MessageNamesTheStepAndTheCheckpoint) {
  EXPECT_EQ(
      InterruptReporter::message(SIGTERM, 5, 10, "the last checkpoint is /c/step-4"),
      "training interrupted by SIGTERM during step 5 of 10; the last checkpoint is /c/step-4");
  EXPECT_TRUE(contains(InterruptReporter::message(SIGINT, 0, 10, "x"), "SIGINT before step 1"));
}

TEST(Interrupt, DescribesTheNewestCompleteCheckpoint) {
  EXPECT_TRUE(contains(describe_last_checkpoint(false, "/nowhere"), "checkpoint.enable is false"));
  const auto dir = test::fresh_test_dir("titan_test_interrupt");
  EXPECT_TRUE(contains(describe_last_checkpoint(true, dir.string()), "no checkpoint in"));
  test::write_file(dir / "step-2" / "index.json", "{}");
  test::write_file(dir / "step-10" / "index.json", "{}");
  test::write_file(dir / "step-12.tmp-99" / "index.json", "{}");  // unfinished: not a checkpoint
  const std::string where = describe_last_checkpoint(true, dir.string());
  EXPECT_TRUE(contains(where, "the last checkpoint is " + (dir / "step-10").string())) << where;
  fs::remove_all(dir);
}

// The real thing: a handler, a watcher thread and the signal raised again. Before, SIGTERM ended
// the process without a word.
void interrupted_during_step_7() {
  ::dup2(STDERR_FILENO, STDOUT_FILENO);  // log lines go to stdout; the death test reads stderr
  InterruptReporter reporter(/*total_steps=*/20, [] { return std::string("no checkpoint here"); },
                             /*log=*/true);
  reporter.set_step(7);
  std::raise(SIGTERM);
  for (;;) ::pause();  // the watcher ends the process
}

TEST(InterruptDeathTest, SigtermLogsOneLineAndStillKills) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(interrupted_during_step_7(), ::testing::KilledBySignal(SIGTERM),
              "training interrupted by SIGTERM during step 7 of 20; no checkpoint here");
}

TEST(Interrupt, SignalsActAsBeforeOnceTheReporterIsGone) {
  struct sigaction before {};
  sigaction(SIGTERM, nullptr, &before);
  {
    InterruptReporter reporter(
        3, [] { return std::string(); }, /*log=*/true);
  }
  struct sigaction after {};
  sigaction(SIGTERM, nullptr, &after);
  EXPECT_EQ(before.sa_handler, after.sa_handler);
  // Another reporter may be made after the first is gone, and a second one at the same time
  // (trainers on several threads) leaves the first one in charge.
  InterruptReporter again(
      3, [] { return std::string(); }, /*log=*/true);
  InterruptReporter nested(
      3, [] { return std::string(); }, /*log=*/true);
  struct sigaction now {};
  sigaction(SIGTERM, nullptr, &now);
  EXPECT_NE(now.sa_handler, before.sa_handler);
}

}  // namespace interrupt_test
}  // namespace titan
