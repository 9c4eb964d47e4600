// Model converters (TorchTitan's model.converters): in-place changes to a built model, applied
// once after it is built (on the meta device or not) and before any parallelism: float8
// ("quantize.linear.float8", or its older name "float8") and MXFP8 ("quantize.linear.mx") linear
// layers (models/common/float8.h, mx.h), float8 and MXFP8 grouped GEMMs of MoE experts
// ("quantize.grouped_mm.float8", "quantize.grouped_mm.mx") and LoRA ("lora"). The names are checked
// when the config is validated (validate_job_config), the device when the converter is applied.
#pragma once

#include "titan/common/device.h"
#include "titan/config/job_config.h"
#include "titan/models/common/float8.h"
#include "titan/models/common/moe.h"
#include "titan/models/model.h"

#include <torch/nn/module.h>

#include <string>
#include <vector>

namespace titan {

// filter_fqns entry that adds torchao's size filter (skip layers too small to gain from float8).
inline constexpr const char* kAutoFilterSmallKn = "auto_filter_small_kn";

// What the float8 converter did to a model, by fully qualified module name.
struct Float8Conversion {
  Float8LinearOptions options;
  std::vector<std::string> converted;
  std::vector<std::string> filtered;   // a filter_fqns entry is a substring of the name
  std::vector<std::string> unaligned;  // a weight dim not a multiple of 16 (_scaled_mm's rule)
  std::vector<std::string> small;      // auto_filter_small_kn: too small to gain from float8
};

// Whether `device` may run float8 linears with these settings: a ConfigError naming the device and
// its compute capability, with a HINT, when it has no float8 matmuls and emulate is off.
void check_float8_device(const Float8LinearSection& config, const DeviceInfo& device);

// Converts the Linear layers of `model` (see Float8Conversion for those it skips) after
// check_float8_device.
Float8Conversion convert_to_float8(torch::nn::Module& model, const Float8LinearSection& config,
                                   const DeviceInfo& device);

// What the MX converter (quantize.linear.mx) did, by fully qualified module name.
struct MxConversion {
  std::vector<std::string> converted;
  std::vector<std::string> filtered;   // a filter_fqns entry is a substring of the name
  std::vector<std::string> unaligned;  // a weight dim not a multiple of the block size, 32
};

// Marks the Linear layers of `model` to compute in MXFP8 (models/common/mx.h, emulated).
MxConversion convert_to_mx(torch::nn::Module& model, const MXLinearSection& config);

// What a grouped-GEMM converter (quantize.grouped_mm.float8 or quantize.grouped_mm.mx) did, by
// the routed experts' module names.
struct ExpertConversion {
  ExpertQuantization quantization;
  std::vector<std::string> converted;
  std::vector<std::string> unaligned;  // a weight dim not a multiple of 16 (float8) or 32 (MX)
};

// Quantizes the routed experts (GroupedExperts, moe.h) of `model` whose module name contains an
// entry of `fqns` (TorchTitan's MoE module filter: "experts", "moe" or "layers.3" select by
// substring). Float8 runs at::_scaled_mm on CUDA GPUs that have it and is emulated on the CPU;
// MXFP8 is emulated everywhere. Throws ConfigError when no experts match (naming the model's),
// or for float8 on a GPU without float8 matmuls. `section` names the converter in messages.
ExpertConversion convert_grouped_experts(torch::nn::Module& model, ExpertGemm gemm,
                                         const std::vector<std::string>& fqns,
                                         const DeviceInfo& device, const std::string& section);

// Applies model.converters to `model` on `device` in order (the float8 converter with
// `float8`, quantize.linear.float8; "lora" with `lora`, models/lora.h), logging what each
// converted and skipped (and the model after conversion when model.print_after_conversion is set).
// Float8 never converts LoRA's adapters, whichever comes first.
void apply_model_converters(Model& model, const ModelSection& config,
                            const Float8LinearSection& float8, const at::Device& device,
                            const LoraSection& lora = {}, const MXLinearSection& mx = {},
                            const QuantizeSection::GroupedMM& grouped_mm = {});

// How many layers of each kind enable_fused_layers switched.
struct FusedLayers {
  int64_t norms = 0, ffns = 0, ropes = 0, attentions = 0;
};
// Switches every RMSNorm, SwiGLU feed-forward, RoPE table and grouped-query attention's default
// kernel of `model` to titan's fused CPU kernels (each still uses them only where they measured
// faster, see fused_ops.h / attention.h). Shared by apply_compile and inference.
FusedLayers enable_fused_layers(torch::nn::Module& model);

// The layers' kernels for training on `device`, and [compile] (TorchTitan's torch.compile).
// On the CPU the layers of `model` run titan's fused kernels (titan/models/common/fused_ops.h:
// RMSNorm, SwiGLU, RoPE; and attention.h's own training attention) wherever they measured faster
// than ATen's composition, whether or not compile.enable is set: they compute the same numbers
// (float32 arithmetic, one rounding), so the fastest exact path is the default, as libtorch picks
// its own kernels. TITAN_CPU_KERNELS=aten keeps ATen's compositions (comparisons, debugging).
// The log line names the paths chosen for `dtype` at `seq_len` and why. On another device the
// kernels do not apply; compile.enable with "model" there gets a warning. Returns how many
// RMSNorm, SwiGLU and RoPE layers were switched. "loss" in components is the trainer's
// (ParallelizeOptions::fused_loss).
int64_t apply_compile(torch::nn::Module& model, const CompileSection& config,
                      const at::Device& device, at::ScalarType dtype = at::kFloat,
                      int64_t seq_len = 0);

// Whether TITAN_CPU_KERNELS asks for ATen's compositions only ("aten"); "" or "auto" for the
// measured choice. Throws ConfigError for another value.
bool aten_cpu_kernels_requested();

}  // namespace titan
