// A Hugging Face folder whose config.json or weight shard is a FIFO (or a device) is refused at
// once with a DataError saying what the file is; before, opening the FIFO blocked forever.
#include "titan/checkpoint/hf_folder.h"
#include "titan/common/check.h"

#include "../test_util.h"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>

namespace titan {
namespace test_hf_inputs {

namespace fs = std::filesystem;
using test::contains;
using test::message_of;

TEST(HfInputs, AFifoConfigOrWeightShardIsRefused) {
  const auto dir = test::fresh_test_dir("titan_test_hf_inputs");
  ASSERT_EQ(::mkfifo((dir / "config.json").c_str(), 0600), 0);
  std::string msg = message_of([&] { ckpt::HfFolderReader reader(dir.string()); });
  EXPECT_TRUE(contains(msg, "config.json' is a FIFO (named pipe), not a regular file")) << msg;

  fs::remove(dir / "config.json");
  test::write_file(dir / "config.json", "{}");
  test::write_file(dir / "model.safetensors.index.json",
                   R"({"weight_map": {"tok_embeddings.weight": "part-1.safetensors"}})");
  ASSERT_EQ(::mkfifo((dir / "part-1.safetensors").c_str(), 0600), 0);
  msg = message_of([&] { ckpt::HfFolderReader reader(dir.string()); });
  EXPECT_TRUE(contains(msg, "Hugging Face weight file")) << msg;
  EXPECT_TRUE(contains(msg, "part-1.safetensors' is a FIFO")) << msg;
  EXPECT_THROW(ckpt::HfFolderReader reader(dir.string()), DataError);
  fs::remove_all(dir);
}

}  // namespace test_hf_inputs
}  // namespace titan
