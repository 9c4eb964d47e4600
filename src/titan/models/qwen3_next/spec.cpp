// Qwen3-Next's registry entry (see spec.h; the flavors are in flavors.cpp).
#include "titan/models/qwen3_next/spec.h"

#include "titan/models/llama3/spec.h"
#include "titan/models/qwen3_next/hf_adapter.h"

namespace titan {

ModelSpec make_qwen3_next_spec() {
  ModelSpec spec = make_decoder_spec(qwen3_next::family());
  spec.hf = qwen3_next::make_hf_adapter();
  return spec;
}

}  // namespace titan
