// PEFT adapter folders (see peft_folder.h).
#include "titan/checkpoint/peft_folder.h"

#include "titan/checkpoint/safetensors.h"
#include "titan/common/check.h"
#include "titan/common/file_io.h"
#include "titan/common/format.h"
#include "titan/common/logging.h"

#include <unistd.h>

#include <filesystem>
#include <utility>
#include <vector>

namespace titan::ckpt {
namespace fs = std::filesystem;

namespace {
constexpr const char* kPeftConfigFile = "adapter_config.json";
constexpr const char* kPeftWeightsFile = "adapter_model.safetensors";
}  // namespace

std::string peft_export_dir(const std::string& folder, int64_t step) {
  return (fs::path(folder) / ("step-" + std::to_string(step) + "-peft")).string();
}

void write_peft_adapter(const std::string& dir, const TensorMap& params,
                        const nlohmann::json& description, const LoraSpec& spec) {
  const TensorMap peft = to_peft_tensors(params, description);
  const nlohmann::json config = peft_adapter_config(params, description, spec);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, t] : peft) {
    tensors.emplace_back(name, t.detach().to(at::kCPU, at::kFloat).contiguous());
  }
  std::error_code ec;
  const fs::path tmp = fs::path(dir + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw DataError("cannot create " + tmp.string() + ": " + ec.message());
  write_safetensors((tmp / kPeftWeightsFile).string(), tensors, {{"format", "pt"}});
  replace_file((tmp / kPeftConfigFile).string(), config.dump(2) + "\n");
  fsync_path(tmp.string(), /*directory=*/true);
  if (fs::exists(dir, ec)) {
    log_warning("replacing the PEFT adapter folder ", dir);
    fs::remove_all(dir, ec);
  }
  fs::rename(tmp, dir, ec);
  if (ec) throw DataError("cannot rename " + tmp.string() + " to " + dir + ": " + ec.message());
  const fs::path parent = fs::path(dir).parent_path();
  fsync_path(parent.empty() ? "." : parent.string(), /*directory=*/true);
  log_info("LoRA adapters written as a PEFT folder: ", dir, " (", peft.size() / 2,
           " adapted layers)");
}

PeftAdapter read_peft_adapter(const std::string& dir, const nlohmann::json& description) {
  const std::string config_path = (fs::path(dir) / kPeftConfigFile).string();
  const std::string weights_path = (fs::path(dir) / kPeftWeightsFile).string();
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(read_regular_file(config_path, "PEFT adapter config"));
  } catch (const nlohmann::json::parse_error& e) {
    throw DataError(message(config_path, ": not JSON (", e.what(), ")"));
  }
  PeftAdapter out;
  out.spec = lora_spec_from_peft_config(config, config_path);
  require_regular_file(weights_path, "PEFT adapter weights");
  const SafetensorsReader reader(weights_path);
  TensorMap peft;
  for (const TensorEntry& e : reader.entries()) {
    // PEFT saves without the adapter name ("default"); accept a file saved with it too.
    std::string name = e.name;
    const std::string named = ".default.weight";
    if (name.size() > named.size() &&
        name.compare(name.size() - named.size(), named.size(), named) == 0) {
      name = name.substr(0, name.size() - named.size()) + ".weight";
    }
    peft.emplace(name, reader.read(e.name).to(at::kFloat));
  }
  try {
    out.params = from_peft_tensors(peft, description, out.spec);
  } catch (const DataError& e) {
    throw DataError(message(weights_path, ": ", e.what()));
  }
  for (const auto& [name, t] : out.params) {
    const bool is_a = name.size() > 14 && name.compare(name.size() - 14, 14, ".lora_a.weight") == 0;
    // (r, in) / (out, r), or per expert (experts, r, in) / (experts, out, r).
    const int64_t r = is_a ? t.size(-2) : t.size(-1);
    if (r != out.spec.rank) {
      throw DataError(message(weights_path, ": ", name, " has rank ", r,
                              ", adapter_config.json r = ", out.spec.rank));
    }
  }
  return out;
}

}  // namespace titan::ckpt
