// Llama 4's registry entry (see spec.h; the flavors are in flavors.cpp).
#include "titan/models/llama4/spec.h"

#include "titan/models/llama3/spec.h"
#include "titan/models/llama4/hf_adapter.h"

namespace titan {

ModelSpec make_llama4_spec() {
  ModelSpec spec = make_decoder_spec(llama4::family());
  spec.hf = llama4::make_hf_adapter();
  return spec;
}

}  // namespace titan
