// A validation set too small for one batch is refused when the trainer is built, before any
// training step (it used to surface at the first validation, validation.freq steps later).
#include "titan/trainer/trainer.h"

#include "titan/common/check.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace titan {
namespace validation_startup_test {

namespace fs = std::filesystem;

// A folder holding one .txt document of `text`.
std::string text_dataset(const std::string& name, const std::string& text) {
  const fs::path dir = fs::temp_directory_path() / ("titan_val_startup_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "doc.txt") << text;
  return dir.string();
}

TEST(ValidationStartup, TooSmallValidationSetIsRefusedBeforeTraining) {
  std::string long_text;
  for (int i = 0; i < 400; ++i) long_text += "the quick brown fox jumps over the lazy dog. ";
  JobConfig c;
  c.job.dump_folder = (fs::temp_directory_path() / "titan_val_startup_run").string();
  c.model.flavor = "tiny";
  c.training.device = "cpu";
  c.model.hf_assets_path = "";  // byte tokenizer
  c.training.dataset = "text";
  c.training.dataset_path = text_dataset("train", long_text);
  c.training.seq_len = 32;
  c.training.local_batch_size = 2;
  c.training.steps = 2;
  c.training.mixed_precision_param = "float32";
  c.training.num_threads = 1;
  c.metrics.peak_flops = 1e12;  // skip the probe
  c.validation.enable = true;
  c.validation.dataset = "text";
  c.validation.dataset_path = text_dataset("val", "too short");
  c.validation.seq_len = 32;
  c.validation.local_batch_size = 4;
  c.validation.freq = 1000;
  try {
    Trainer trainer(c);
    FAIL() << "a validation set of 9 bytes was accepted for batches of 4 x 33 tokens";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("validation set 'text' yields no full batch of 4 x 33 tokens"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("HINT: lower validation.local_batch_size or validation.seq_len"),
              std::string::npos)
        << what;
  }
  // A set that fills one batch trains and validates.
  c.validation.dataset_path = c.training.dataset_path;
  EXPECT_EQ(Trainer(c).train().validation_losses.size(), 1u);
  fs::remove_all(c.job.dump_folder);
}

}  // namespace validation_startup_test
}  // namespace titan
