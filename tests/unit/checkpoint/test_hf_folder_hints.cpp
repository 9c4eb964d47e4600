// A titan checkpoint where a Hugging Face folder is expected (checkpoint.initial_load_in_hf on
// our own checkpoint) is recognised and named, instead of "config.json: cannot open".
#include "titan/checkpoint/hf_folder.h"
#include "titan/common/check.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace titan {
namespace test_hf_folder_hints {

namespace fs = std::filesystem;

std::string config_error(const std::string& dir) {
  try {
    ckpt::HfFolderReader reader(dir);
  } catch (const ConfigError& e) {
    return e.what();
  } catch (const DataError& e) {
    return std::string("DataError: ") + e.what();
  }
  return "";
}

TEST(HfFolderHints, TitanCheckpointIsNamedWithTheFlagToDrop) {
  const fs::path root = fs::temp_directory_path() / "titan_hf_folder_hints";
  fs::remove_all(root);
  fs::create_directories(root / "step-3");
  std::ofstream(root / "step-3" / "index.json")
      << R"({"format": "titan-checkpoint", "version": 2})";
  for (const fs::path& dir : {root / "step-3", root}) {  // a step folder, or the folder of steps
    const std::string msg = config_error(dir.string());
    EXPECT_NE(msg.find("'" + dir.string() + "' is a titan checkpoint, not a Hugging Face folder"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("HINT: drop checkpoint.initial_load_in_hf"), std::string::npos) << msg;
  }
  // Any other folder without config.json is still a plain missing-file DataError.
  fs::create_directories(root / "empty");
  EXPECT_EQ(config_error((root / "empty").string()).rfind("DataError: ", 0), 0u);
  fs::remove_all(root);
}

}  // namespace test_hf_folder_hints
}  // namespace titan
