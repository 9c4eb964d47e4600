// Fuzzes Hugging Face config.json reading for Llama, Llama 4, Qwen3 and Qwen3-Next
// (args_from_hf_config: dims, optional keys, rope_parameters / rope_theta + rope_scaling, fixed
// keys; Llama 4's layer lists, chunks and text_config; Qwen3's MoE keys; Qwen3-Next's layer_types,
// linear-attention sizes and partial RoPE) and what the adapters derive from it: the model
// description (describe_args), which must read back to the same architecture.
//
// JSON syntax errors are a DataError in the app (hf_folder.cpp read_json); here they end the run.
#include "fuzz_util.h"

#include "titan/models/llama3/hf_adapter.h"
#include "titan/models/llama4/hf_adapter.h"
#include "titan/models/llama4/spec.h"
#include "titan/models/qwen3/hf_adapter.h"
#include "titan/models/qwen3/spec.h"
#include "titan/models/qwen3_next/hf_adapter.h"
#include "titan/models/qwen3_next/spec.h"

#include <cstdio>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace titan;
  const nlohmann::json config = nlohmann::json::parse(data, data + size, /*cb=*/nullptr,
                                                      /*allow_exceptions=*/false);
  if (config.is_discarded()) return 0;
  // The reader of `family`: its arguments' description reads back to the same architecture.
  const auto check = [&](llama3::Llama3Args (*read)(const nlohmann::json&),
                         const llama3::Family& family) {
    fuzz::expect_success_or_rejection([&] {
      const llama3::Llama3Args args = read(config);
      const nlohmann::json description = llama3::describe_args(args, family);
      llama3::describe(args);
      const llama3::Llama3Args back = llama3::args_from_description(description, family);
      if (llama3::resolved_args(back) != llama3::resolved_args(args)) {
        std::fprintf(stderr, "description %s reads back as another architecture\n",
                     description.dump().c_str());
        std::abort();
      }
    });
  };
  check(&llama3::args_from_hf_config, llama3::llama3_family());
  check(&llama4::args_from_hf_config, llama4::family());
  check(&qwen3::args_from_hf_config, qwen3::family());
  check(&qwen3_next::args_from_hf_config, qwen3_next::family());
  return 0;
}
