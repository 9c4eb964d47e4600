// Qwen3's registry entry (see spec.h; the flavors are in flavors.cpp).
#include "titan/models/qwen3/spec.h"

#include "titan/models/llama3/spec.h"
#include "titan/models/qwen3/hf_adapter.h"

namespace titan {

ModelSpec make_qwen3_spec() {
  ModelSpec spec = make_decoder_spec(qwen3::family());
  spec.hf = qwen3::make_hf_adapter();
  return spec;
}

}  // namespace titan
