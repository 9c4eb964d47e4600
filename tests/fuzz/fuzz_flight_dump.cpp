// Fuzzes `titan fr analyze` on what crashed jobs leave behind: the input is split at "--8<--" lines
// into up to four flight-recorder dumps (rank_<i>.json of one folder), which are parsed, checked
// field by field and compared group by group (analyze_flight_records).
#include "fuzz_util.h"

#include "titan/distributed/flight_recorder.h"

#include <filesystem>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan;
  const std::filesystem::path folder = fuzz::scratch_dir() / "dumps";
  std::filesystem::remove_all(folder);
  std::filesystem::create_directories(folder);
  const std::vector<std::string_view> parts = fuzz::split_input(data, size, "\n--8<--\n");
  for (size_t i = 0; i < parts.size() && i < 4; ++i) {
    fuzz::write_input("dumps/rank_" + std::to_string(i) + ".json", parts[i]);
  }
  fuzz::expect_success_or_rejection([&] { dist::analyze_flight_records(folder.string()); });
  return 0;
}
