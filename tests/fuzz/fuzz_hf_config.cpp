// Fuzzes Hugging Face config.json reading for Llama (args_from_hf_config: dims, optional keys,
// rope_parameters / rope_theta + rope_scaling, fixed keys) and what the adapter derives from it:
// the model description (describe_args), which must read back to the same architecture.
//
// JSON syntax errors are a DataError in the app (hf_folder.cpp read_json); here they end the run.
#include "fuzz_util.h"

#include "titan/models/llama3/hf_adapter.h"

#include <cstdio>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan;
  const nlohmann::json config = nlohmann::json::parse(data, data + size, /*cb=*/nullptr,
                                                      /*allow_exceptions=*/false);
  if (config.is_discarded()) return 0;
  fuzz::expect_success_or_rejection([&] {
    const llama3::Llama3Args args = llama3::args_from_hf_config(config);
    const nlohmann::json description = llama3::describe_args(args);
    llama3::describe(args);
    const llama3::Llama3Args back = llama3::args_from_description(description);
    if (llama3::resolved_args(back) != llama3::resolved_args(args)) {
      std::fprintf(stderr, "description %s reads back as another architecture\n",
                   description.dump().c_str());
      std::abort();
    }
  });
  return 0;
}
