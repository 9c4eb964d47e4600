// The [quantize.*] sections of the job config (job_config.h): TorchTitan's low-precision
// training settings, read by the model converters (models/converters.h).
#pragma once

#include "titan/config/key_support.h"

#include <string>
#include <vector>

namespace titan {

// [quantize.linear.float8], [quantize.linear.mx], [quantize.grouped_mm.float8] and
// [quantize.grouped_mm.mx]: read by the model converters (model.converters).
struct Float8LinearSection {
  static constexpr const char* kName = "quantize.linear.float8";
  bool enable_fsdp_float8_all_gather = false;
  bool precompute_float8_dynamic_scale_for_fsdp = false;
  std::string recipe_name = "";  // "": unset
  std::vector<std::string> filter_fqns = {};
  bool emulate = false;

  template <class V>
  void visit(V& v) {
    v("enable_fsdp_float8_all_gather", enable_fsdp_float8_all_gather,
      "FSDP all-gathers the weights of float8 layers in float8, cast on each shard with one "
      "scale per weight (tensorwise recipe only; no effect without FSDP sharding)");
    v("precompute_float8_dynamic_scale_for_fsdp", precompute_float8_dynamic_scale_for_fsdp,
      "Compute the float8 all-gather's scales for all weights with one all-reduce at the start "
      "of each forward (needs enable_fsdp_float8_all_gather)");
    v("recipe_name", recipe_name,
      "Float8 recipe: tensorwise (unset), rowwise (power-of-2 scales), rowwise_with_gw_hp");
    v("filter_fqns", filter_fqns,
      "Linear modules left in high precision: any whose name contains an entry; "
      "\"auto_filter_small_kn\" also keeps layers too small to gain (torchao's thresholds)");
    v("emulate", emulate,
      "Run the float8 numerics as float32 matmuls of the dequantized operands (any device, e.g. "
      "CPU tests) instead of at::_scaled_mm (CUDA compute capability >= 8.9)");
  }
};

struct MXLinearSection {
  static constexpr const char* kName = "quantize.linear.mx";
  std::string mxfp8_dim1_cast_kernel_choice = "triton";
  std::string recipe_name = "mxfp8_cublas";
  std::vector<std::string> filter_fqns = {"output"};

  template <class V>
  void visit(V& v) {
    v("mxfp8_dim1_cast_kernel_choice", mxfp8_dim1_cast_kernel_choice,
      "MXFP8 cast kernel on GPUs: triton, cuda or torch (titan's casts are ATen ops)");
    v("recipe_name", recipe_name,
      "MX recipe: mxfp8_cublas (also mxfp8_emulated): e4m3 blocks of 32, FLOOR scales; "
      "mxfp8_cublas_rceil: RCEIL scales");
    v("filter_fqns", filter_fqns, "Linear modules left in high precision");
  }
};

struct Float8GroupedMMSection {
  static constexpr const char* kName = "quantize.grouped_mm.float8";
  std::vector<std::string> fqns = {};

  template <class V>
  void visit(V& v) {
    v("fqns", fqns,
      "MoE modules whose routed experts' GEMMs run in float8 rowwise (substrings of module "
      "names, e.g. \"experts\")");
  }
};

struct MXGroupedMMSection {
  static constexpr const char* kName = "quantize.grouped_mm.mx";
  std::string recipe_name = "mxfp8";
  std::vector<std::string> fqns = {};

  template <class V>
  void visit(V& v) {
    v("recipe_name", recipe_name,
      "MX recipe for grouped GEMMs: mxfp8 (e4m3 blocks of 32, RCEIL scales)");
    v("fqns", fqns,
      "MoE modules whose routed experts' GEMMs run in MXFP8 (substrings of module names, e.g. "
      "\"experts\")");
  }
};

struct QuantizeSection {
  struct Linear {
    Float8LinearSection float8;
    MXLinearSection mx;
  } linear;
  struct GroupedMM {
    Float8GroupedMMSection float8;
    MXGroupedMMSection mx;
  } grouped_mm;
};

}  // namespace titan
