// Fuzzes safetensors files (SafetensorsReader: the 8-byte header length, the JSON header, dtypes,
// shapes, data_offsets tiling the data section, __metadata__), then reads every tensor.
#include "fuzz_util.h"

#include "titan/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan;
  fuzz::parse_input_file("model.safetensors", data, size, [](const std::string& path) {
    ckpt::SafetensorsReader reader(path);
    for (const ckpt::TensorEntry& entry : reader.entries()) reader.read(entry.name);
  });
  return 0;
}
