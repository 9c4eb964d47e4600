// Fuzzes a checkpoint's index.json through CheckpointReader (verify = true, as at resume): the
// format and version, file names and sizes, tensor entries and their shard boxes, the state.
// Every tensor of an index that loads is read whole.
//
// The folder is a real checkpoint written once per process by write_checkpoint (two small tensors
// in shard files next to index.json); each input replaces only its index.json. The seed corpus
// holds indexes of that checkpoint, so mutations start from ones whose sizes and CRCs match.
#include "fuzz_util.h"

#include "titan/checkpoint/checkpoint_files.h"

#include <filesystem>

namespace {

// <scratch>/step-3: the folder name matches the seeds' recorded step.
std::string checkpoint_dir() {
  static const std::string dir = [] {
    const std::string d = (titan::fuzz::scratch_dir() / "step-3").string();
    std::vector<titan::ckpt::SavedTensor> tensors;
    tensors.push_back({"a", at::arange(6, at::kFloat).view({2, 3}), {}});
    tensors.push_back({"b", at::arange(4, at::kLong), {}});
    titan::ckpt::write_checkpoint(d, tensors, {{"step", 3}}, /*max_shard_bytes=*/16);
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan;
  const std::string dir = checkpoint_dir();
  {
    std::ofstream out(dir + "/index.json", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  fuzz::expect_success_or_rejection([&] {
    ckpt::CheckpointReader reader(dir, /*verify=*/true);
    for (const std::string& name : reader.names()) {
      reader.meta(name);
      reader.read(name);
    }
  });
  return 0;
}
