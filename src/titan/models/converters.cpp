// Model converters (see converters.h). Layer selection follows TorchTitan's module_filter_fn and
// torchao's auto filter: a layer is converted when no filter_fqns entry is a substring of its
// name and both weight dims are multiples of 16; with "auto_filter_small_kn" listed, also only
// when its (N = out, K = in) clear the recipe's size thresholds (H100 measurements in torchao).
#include "titan/models/converters.h"

#include "titan/common/check.h"
#include "titan/common/cpu.h"
#include "titan/common/format.h"
#include "titan/common/logging.h"
#include "titan/kernels/fused_layers.h"
#include "titan/models/common/attention.h"
#include "titan/models/common/feed_forward.h"
#include "titan/models/common/linear.h"
#include "titan/models/common/moe.h"
#include "titan/models/common/mx.h"
#include "titan/models/common/norms.h"
#include "titan/models/common/rope.h"
#include "titan/models/lora.h"
#include "titan/models/registry.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

namespace titan {
namespace {

// torchao's _auto_filter_for_recipe: whether a (n_out, k_in) layer is large enough for float8 to
// be faster than bf16.
bool large_enough(Float8Recipe recipe, int64_t n, int64_t k) {
  if (recipe == Float8Recipe::kTensorwise) return !(k <= 4096 && n <= 1024);
  if (n <= 2048 || k <= 1024) return false;
  return !(n <= 4096 && k <= 2048);
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

void check_float8_device(const Float8LinearSection& config, const DeviceInfo& device) {
  if (config.emulate || supports_float8(device)) return;
  std::string found = device.describe();
  if (device.device.is_cuda()) {
    found += ", compute capability " + std::to_string(device.compute_major) + "." +
             std::to_string(device.compute_minor);
  }
  throw ConfigError(message(
      "model.converters asks for float8 linear layers, but the training device ", found,
      " has no float8 matmuls (at::_scaled_mm needs a CUDA GPU of compute capability >= 8.9: "
      "Ada, Hopper, Blackwell). HINT: set quantize.linear.float8.emulate = true to run the same "
      "float8 numerics in float32 (slower; for tests and CPU runs), or train on such a GPU"));
}

Float8Conversion convert_to_float8(torch::nn::Module& model, const Float8LinearSection& config,
                                   const DeviceInfo& device) {
  check_float8_device(config, device);
  Float8Conversion out;
  out.options.recipe = float8_recipe_from_name(config.recipe_name);
  out.options.emulate = config.emulate;
  std::vector<std::string> filters = config.filter_fqns;
  const auto auto_flag = std::find(filters.begin(), filters.end(), kAutoFilterSmallKn);
  const bool auto_filter = auto_flag != filters.end();
  if (auto_filter) filters.erase(auto_flag);
  for (const auto& item : model.named_modules()) {
    auto* linear = dynamic_cast<Linear*>(item.value().get());
    if (linear == nullptr || linear->is_adapter) continue;  // LoRA adapters stay high precision
    const std::string& name = item.key();
    TITAN_CONFIG_CHECK(linear->nf4_weight == nullptr, "float8: ", name, " holds its frozen ",
                       "weight in NF4 (QLoRA); a layer's frozen base is either float8 or NF4, ",
                       "not both");
    const int64_t n = linear->weight.size(0), k = linear->weight.size(1);
    const bool filtered = std::any_of(filters.begin(), filters.end(), [&](const std::string& f) {
      return name.find(f) != std::string::npos;
    });
    if (filtered) {
      out.filtered.push_back(name);
    } else if (n % 16 != 0 || k % 16 != 0) {
      out.unaligned.push_back(name + " (" + std::to_string(n) + "x" + std::to_string(k) + ")");
    } else if (auto_filter && !large_enough(out.options.recipe, n, k)) {
      out.small.push_back(name);
    } else {
      linear->float8 = out.options;
      out.converted.push_back(name);
    }
  }
  return out;
}

MxConversion convert_to_mx(torch::nn::Module& model, const MXLinearSection& config) {
  MxConversion out;
  for (const auto& item : model.named_modules()) {
    auto* linear = dynamic_cast<Linear*>(item.value().get());
    if (linear == nullptr || linear->is_adapter) continue;  // LoRA adapters stay high precision
    const std::string& name = item.key();
    TITAN_CONFIG_CHECK(linear->nf4_weight == nullptr, "MX: ", name, " holds its frozen weight ",
                       "in NF4 (QLoRA); a layer's frozen base is either MXFP8 or NF4, not both");
    const int64_t n = linear->weight.size(0), k = linear->weight.size(1);
    const bool filtered =
        std::any_of(config.filter_fqns.begin(), config.filter_fqns.end(),
                    [&](const std::string& f) { return name.find(f) != std::string::npos; });
    if (filtered) {
      out.filtered.push_back(name);
    } else if (n % kMxBlock != 0 || k % kMxBlock != 0) {
      out.unaligned.push_back(name + " (" + std::to_string(n) + "x" + std::to_string(k) + ")");
    } else {
      linear->mx =
          config.recipe_name == "mxfp8_cublas_rceil" ? MxScaleRule::kRceil : MxScaleRule::kFloor;
      out.converted.push_back(name);
    }
  }
  return out;
}

ExpertConversion convert_grouped_experts(torch::nn::Module& model, ExpertGemm gemm,
                                         const std::vector<std::string>& fqns,
                                         const DeviceInfo& device, const std::string& section) {
  ExpertConversion out;
  out.quantization.gemm = gemm;
  if (gemm == ExpertGemm::kFloat8Rowwise) {
    if (device.device.is_cuda()) {
      TITAN_CONFIG_CHECK(supports_float8(device), section, " runs the MoE experts' GEMMs in ",
                         "float8, but ", device.describe(), " (compute capability ",
                         device.compute_major, ".", device.compute_minor,
                         ") has no float8 matmuls (at::_scaled_mm needs compute capability >= "
                         "8.9). HINT: remove \"",
                         section, "\" from model.converters, or train on such a GPU");
      out.quantization.emulate = false;
      // ATen's float8 rowwise grouped kernel (at::_scaled_grouped_mm) is built for 9.x.
      out.quantization.grouped = device.compute_major == 9;
    } else {
      out.quantization.emulate = true;  // the CPU: float32 products of the float8 operands
    }
  }
  const int64_t align = gemm == ExpertGemm::kMxfp8 ? kMxBlock : 16;
  std::vector<std::string> all_experts;
  for (const auto& item : model.named_modules()) {
    auto* experts = dynamic_cast<GroupedExperts*>(item.value().get());
    if (experts == nullptr) continue;
    const std::string& name = item.key();
    all_experts.push_back(name);
    const bool selected = std::any_of(fqns.begin(), fqns.end(), [&](const std::string& f) {
      return name.find(f) != std::string::npos;
    });
    if (!selected) continue;
    const at::Tensor& w1 = experts->w1->weight;  // (experts, hidden, dim)
    const int64_t hidden = w1.size(1), dim = w1.size(2);
    if (hidden % align != 0 || dim % align != 0) {
      out.unaligned.push_back(name + " (hidden " + std::to_string(hidden) + ", dim " +
                              std::to_string(dim) + ")");
      continue;
    }
    experts->quantization = out.quantization;
    out.converted.push_back(name);
  }
  std::string listed;
  for (const std::string& f : fqns) listed += (listed.empty() ? "\"" : ", \"") + f + "\"";
  TITAN_CONFIG_CHECK(!all_experts.empty(), "model.converters lists \"", section,
                     "\", but the model has no MoE experts. HINT: use an MoE flavor or remove it");
  TITAN_CONFIG_CHECK(!out.converted.empty() || !out.unaligned.empty(), section, ".fqns [", listed,
                     "] selects none of the model's MoE experts (", joined(all_experts),
                     "). HINT: fqns = [\"experts\"] selects them all");
  return out;
}

FusedLayers enable_fused_layers(torch::nn::Module& model) {
  FusedLayers out;
  for (const auto& m : model.modules(/*include_self=*/true)) {
    if (auto* n = dynamic_cast<RMSNorm*>(m.get())) n->fused = true, ++out.norms;
    if (auto* f = dynamic_cast<FeedForward*>(m.get())) f->fused = true, ++out.ffns;
    if (auto* r = dynamic_cast<RotaryEmbedding*>(m.get())) r->fused = true, ++out.ropes;
    // Grouped-query attention's default kernel only (multi-head latent attention keeps SDPA;
    // context parallelism, applied later, replaces the kernel with its own).
    if (auto* a = dynamic_cast<Attention*>(m.get())) {
      if (auto* c = dynamic_cast<CausalAttention*>(a->inner_attention.get()))
        c->fused = true, ++out.attentions;
    }
  }
  return out;
}

bool aten_cpu_kernels_requested() {
  const char* v = std::getenv("TITAN_CPU_KERNELS");
  const std::string value = v == nullptr ? "" : v;
  if (value.empty() || value == "auto") return false;
  if (value == "aten") return true;
  throw ConfigError(message("TITAN_CPU_KERNELS='", value,
                            "' is not one of auto (titan's kernels where they measured faster, the "
                            "default) or aten (ATen's compositions only)"));
}

int64_t apply_compile(torch::nn::Module& model, const CompileSection& config,
                      const at::Device& device, at::ScalarType dtype, int64_t seq_len) {
  const bool model_part = std::find(config.components.begin(), config.components.end(), "model") !=
                          config.components.end();
  if (!device.is_cpu()) {
    if (config.enable && model_part) {
      log_warning("compile.enable: titan's fused kernels are CPU kernels; on ", device.str(),
                  " these layers keep ATen's ops");
    }
    return 0;
  }
  const std::string dtype_text = dtype_name(dtype);
  const std::string why = is_reduced_float(dtype) ? " (" + fast_bf16_matmul_reason() + ")" : "";
  const std::string matmuls =
      widens_reduced_matmul(dtype, device)
          ? dtype_text + " matmuls and attention in float32 on the rounded operands" + why
          : dtype_text + " matmuls by ATen" + why;
  if (aten_cpu_kernels_requested()) {
    log_info("CPU paths: ", matmuls,
             "; ATen's compositions for every layer (TITAN_CPU_KERNELS=aten)");
    return 0;
  }
  const auto [norms, ffns, ropes, attentions] = enable_fused_layers(model);
  std::ostringstream os;
  os << "CPU paths (each measured fastest on this kind of CPU; same numbers): " << matmuls
     << "; titan's RoPE kernel (" << ropes << " tables)";
  if (kernels::fused_is_faster(kernels::FusedOp::kRmsNorm, dtype)) {
    os << ", RMSNorm (" << norms << ") and SwiGLU (" << ffns << ")";
  } else if (dtype == at::kBFloat16 && widens_reduced_matmul(dtype, device)) {
    // FeedForward keeps its widened products in float32 around widened_swiglu.
    os << "; ATen's RMSNorm (faster than titan's in " << dtype_text << "); titan's widened SwiGLU ("
       << ffns << ", between float32 products)";
  } else {
    os << "; ATen's RMSNorm and SwiGLU (faster than titan's in " << dtype_text << ")";
  }
  if (attentions > 0 && seq_len > 0) {
    os << (materialised_attention_is_faster(dtype, seq_len) ? "; titan's attention ("
                                                            : "; SDPA attention (")
       << attentions << " layers, at seq " << seq_len << " in " << dtype_text << ")";
  }
  if (config.enable && model_part) os << "; compile.enable adds nothing to these";
  log_info(os.str());
  return norms + ffns + ropes;
}

void apply_model_converters(Model& model, const ModelSection& config,
                            const Float8LinearSection& float8, const at::Device& device,
                            const LoraSection& lora, const MXLinearSection& mx,
                            const QuantizeSection::GroupedMM& grouped_mm) {
  if (config.converters.empty()) return;
  for (const std::string& name : config.converters) {
    if (name == "lora") {
      const LoraSpec spec = LoraSpec::from_section(lora);
      const LoraApplied a = apply_lora(model, spec, model_description(config));
      log_info("LoRA: rank ", spec.rank, ", alpha ", spec.alpha, " (scaling ", spec.scaling(),
               spec.use_rslora ? ", rank-stabilized" : "", "), dropout ", spec.dropout, " on ",
               a.adapted.size(), " linear layers",
               a.adapted_experts.empty() ? std::string()
                                         : message(" and the routed experts of ",
                                                   a.adapted_experts.size(), " MoE layers"),
               "; trained ", with_commas(a.adapter_params), " parameters, frozen ",
               with_commas(a.frozen_params), " (",
               100.0 * static_cast<double>(a.adapter_params) /
                   static_cast<double>(std::max<int64_t>(1, a.adapter_params + a.frozen_params)),
               "% trained)");
      continue;
    }
    if (name == "quantize.linear.mx") {
      const MxConversion c = convert_to_mx(model, mx);
      log_info("MXFP8 linear layers (", mx.recipe_name, " recipe, blocks of ", kMxBlock,
               ", emulated: dequantized operands multiplied in float32",
               device.is_cuda() ? "; the block-scaled GEMMs of compute capability 10.x GPUs are "
                                  "not wired yet"
                                : "",
               "): ", c.converted.size(), " converted, ", c.filtered.size() + c.unaligned.size(),
               " kept in high precision");
      if (!c.filtered.empty()) log_info("MX: filter_fqns keeps ", joined(c.filtered));
      if (!c.unaligned.empty()) {
        log_info("MX: dims not multiples of ", kMxBlock, " keep ", joined(c.unaligned));
      }
      if (c.converted.empty()) {
        log_warning("MX: no linear layer was converted; the model trains in high precision");
      }
      continue;
    }
    if (name == "quantize.grouped_mm.float8" || name == "quantize.grouped_mm.mx") {
      const bool mx_experts = name == "quantize.grouped_mm.mx";
      const ExpertConversion c = convert_grouped_experts(
          model, mx_experts ? ExpertGemm::kMxfp8 : ExpertGemm::kFloat8Rowwise,
          mx_experts ? grouped_mm.mx.fqns : grouped_mm.float8.fqns, device_info(device), name);
      const char* how = mx_experts ? "MXFP8 (RCEIL scales, blocks of 32, each expert's tokens "
                                     "padded to 32), emulated: dequantized operands multiplied in "
                                     "float32"
                        : c.quantization.emulate
                            ? "float8 rowwise (power-of-2 scales per expert), emulated in float32"
                        : c.quantization.grouped
                            ? "float8 rowwise (power-of-2 scales per expert), "
                              "at::_scaled_grouped_mm"
                            : "float8 rowwise (power-of-2 scales per expert), at::_scaled_mm per "
                              "expert";
      log_info("MoE grouped GEMMs in ", how, ": ", c.converted.size(), " MoE layers converted (",
               joined(c.converted), ")", c.unaligned.empty() ? "" : ", ",
               c.unaligned.empty()
                   ? ""
                   : message(c.unaligned.size(),
                             " kept in high precision (dims "
                             "not multiples of ",
                             mx_experts ? kMxBlock : 16, ": ", joined(c.unaligned), ")"));
      if (c.converted.empty()) {
        log_warning(name, ": no MoE experts were converted; they train in high precision");
      }
      continue;
    }
    // validate_job_config admits only the float8 linear converter's two names.
    TITAN_CHECK(name == "float8" || name == "quantize.linear.float8", "model converter '", name,
                "' is not built");
    const Float8Conversion c = convert_to_float8(model, float8, device_info(device));
    log_info("float8 linear layers (", float8_recipe_name(c.options.recipe), " recipe",
             c.options.emulate ? ", emulated in float32" : ", at::_scaled_mm",
             "): ", c.converted.size(), " converted, ",
             c.filtered.size() + c.unaligned.size() + c.small.size(), " kept in high precision");
    if (!c.filtered.empty()) log_info("float8: filter_fqns keeps ", joined(c.filtered));
    if (!c.unaligned.empty()) {
      log_info("float8: dims not multiples of 16 (float8 matmuls need them) keep ",
               joined(c.unaligned));
    }
    if (!c.small.empty()) log_info("float8: ", kAutoFilterSmallKn, " keeps ", joined(c.small));
    if (c.converted.empty()) {
      log_warning("float8: no linear layer was converted; the model trains in high precision");
    }
  }
  if (config.print_after_conversion) {
    std::ostringstream s;
    s << model;
    log_info("model after conversion:\n", s.str());
  }
}

}  // namespace titan
