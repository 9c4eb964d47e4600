// Fuzzes image decoding (components/data/image.h: PNG through libpng, JPEG through libjpeg-turbo,
// their errors carried out of the C libraries by longjmp): any bytes decode or throw DataError.
#include "fuzz_util.h"

#include "titan/components/data/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan;
  fuzz::expect_success_or_rejection(
      [&] { decode_image(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz"); });
  return 0;
}
