// `titan convert`: Hugging Face interop for trained models.
//   to-hf    our checkpoint -> a transformers LlamaForCausalLM folder (config.json, safetensors,
//            tokenizer files)
//   to-peft  the LoRA adapters of our checkpoint -> a PEFT adapter folder
//   from-hf  a transformers folder (and a PEFT adapter) -> a model-only checkpoint step directory
//   logits   one forward pass of a checkpoint or HF folder on given token ids, written as float32
//            (used by tests/e2e/test_hf_interop.sh against an independent Python reference)
//   diff     compares the model tensors of two checkpoints / HF folders bit for bit
// Usage errors throw ConfigError (exit 2); unreadable or corrupt inputs DataError (exit 1).
#include "commands.h"
#include "flags.h"

#include "titan/checkpoint/checkpoint_files.h"
#include "titan/checkpoint/hf_convert.h"
#include "titan/checkpoint/hf_folder.h"
#include "titan/checkpoint/model_loader.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/common/check.h"
#include "titan/components/tokenizer/tokenizer.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

namespace titan {
namespace {

struct Args {
  std::string action;
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;  // by flag name
  bool merge_lora = false;
};

const std::vector<std::string> kActions = {"to-hf", "to-peft", "from-hf", "logits", "diff"};

// The flags and arguments of one action; the values land in out.options under the flag's name.
FlagTable convert_flags(const std::string& action, Args& out) {
  const auto keep = [&out](const char* name) {
    return [&out, name](const std::string& v) { out.options[name] = v; };
  };
  if (action == "to-hf") {
    return FlagTable(
               "titan convert to-hf CHECKPOINT OUT [--dtype D] [--max_shard_size BYTES] "
               "[--tokenizer PATH]",
               "Writes the model of CHECKPOINT as a Hugging Face Llama folder OUT: config.json,\n"
               "model.safetensors (or model-0000k-of-0000n.safetensors +\n"
               "model.safetensors.index.json above --max_shard_size) and the tokenizer files the\n"
               "model was trained with.")
        .positional("CHECKPOINT", "a step-N directory, or a checkpoint folder: its latest step")
        .positional("OUT", "the folder to write")
        .value("--dtype", "float32|bfloat16|float16", "the stored dtype (default: the model's)",
               keep("--dtype"))
        .value("--max_shard_size", "BYTES",
               "largest file (default 5GB; suffixes KB, MB, GB = powers of 1000)",
               keep("--max_shard_size"))
        .value("--tokenizer", "PATH", "tokenizer files (default: the path the checkpoint records)",
               keep("--tokenizer"))
        .toggle("--merge-lora",
                "fold the LoRA adapters of a LoRA run into the weights (W + scaling * B A); such "
                "a checkpoint needs it",
                &out.merge_lora);
  }
  if (action == "to-peft") {
    return FlagTable(
               "titan convert to-peft CHECKPOINT OUT",
               "Writes the LoRA adapters of CHECKPOINT (a run with model.converters =\n"
               "[\"lora\"]) as a PEFT folder OUT: adapter_config.json and\n"
               "adapter_model.safetensors, which peft's PeftModel.from_pretrained loads onto\n"
               "the Hugging Face base model.")
        .positional("CHECKPOINT", "a step-N directory, or a checkpoint folder: its latest step")
        .positional("OUT", "the folder to write");
  }
  if (action == "from-hf") {
    return FlagTable("titan convert from-hf HF_DIR OUT [--adapter PEFT_DIR]",
                     "Writes a model-only checkpoint step directory OUT, loadable by\n"
                     "--checkpoint.initial_load_path and `titan generate --checkpoint`. Float32\n"
                     "weights survive to-hf + from-hf bit for bit.")
        .positional("HF_DIR", "a Hugging Face folder (config.json, *.safetensors)")
        .positional("OUT", "the step directory to write")
        .value("--adapter", "PEFT_DIR",
               "a PEFT LoRA adapter of that model: the checkpoint holds it too (train on with "
               "model.converters = [\"lora\"] and the same [lora] settings, or generate with it)",
               keep("--adapter"));
  }
  if (action == "logits") {
    return FlagTable("titan convert logits MODEL --ids \"1 2 3\" [--out FILE]",
                     "Runs MODEL in float32 on the ids and writes the logits (seqlen, vocab) as\n"
                     "tensor \"logits\" of a safetensors FILE (a model with multi-token\n"
                     "prediction also each depth k's as \"mtp_logits_k\"), or prints the argmax\n"
                     "per position.")
        .positional("MODEL", "a checkpoint or a Hugging Face folder")
        .value("--ids", "\"ID ...\"", "the token ids, space-separated", keep("--ids"))
        .value("--out", "FILE", "the safetensors file to write", keep("--out"));
  }
  return FlagTable(
             "titan convert diff MODEL_A MODEL_B [--atol A] [--rtol R]",
             "Compares the model tensors (our names, stored dtypes) of two models; exit 0 if\n"
             "all are bit-identical (or, with --atol/--rtol, |A - B| <= atol + rtol * |B|\n"
             "elementwise), 1 otherwise.")
      .positional("MODEL_A", "a checkpoint or a Hugging Face folder")
      .positional("MODEL_B", "another")
      .value("--atol", "A", "absolute tolerance", keep("--atol"))
      .value("--rtol", "R", "relative tolerance", keep("--rtol"));
}

std::vector<FlagTable> convert_actions(Args& out) {
  std::vector<FlagTable> tables;
  for (const std::string& action : kActions) tables.push_back(convert_flags(action, out));
  return tables;
}

Args parse_args(const std::vector<std::string>& args) {
  Args out;
  Args unused;
  out.action = choose_action(args, convert_actions(unused));
  out.positional = convert_flags(out.action, out)
                       .parse_exact(std::vector<std::string>(args.begin() + 1, args.end()));
  return out;
}

uint64_t parse_size(const std::string& text) {
  size_t used = 0;
  long double value = -1;
  try {
    value = std::stold(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string suffix = text.substr(used);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::map<std::string, long double> scale = {
      {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}};
  if (used == 0 || !(value > 0) || scale.count(suffix) == 0) {
    throw ConfigError(message(
        "--max_shard_size expects a positive size such as 1000000 or 5GB, got '", text, "'"));
  }
  return static_cast<uint64_t>(value * scale.at(suffix));
}

at::ScalarType parse_dtype(const std::string& text) {
  if (text == "float32") return at::kFloat;
  if (text == "bfloat16") return at::kBFloat16;
  if (text == "float16") return at::kHalf;
  throw ConfigError(message("--dtype must be float32, bfloat16 or float16, got '", text, "'"));
}

// A step directory itself, or the latest complete one in a checkpoint folder.
std::string resolve_checkpoint_dir(const std::string& path) {
  if (ckpt::is_checkpoint_dir(path)) return path;
  const auto steps = ckpt::list_step_dirs(path);
  if (steps.empty()) {
    throw ConfigError(message("'", path,
                              "' is not a titan checkpoint (no index.json, no step-N "
                              "directories)"));
  }
  return steps.back().second;
}

int to_hf(const Args& args) {
  ckpt::HfWriteOptions options;
  if (args.options.count("--dtype")) options.dtype = parse_dtype(args.options.at("--dtype"));
  options.max_shard_bytes = args.options.count("--max_shard_size")
                                ? parse_size(args.options.at("--max_shard_size"))
                                : 5'000'000'000ull;
  const std::string dir = resolve_checkpoint_dir(args.positional[0]);
  if (args.options.count("--tokenizer")) {
    options.tokenizer_path = args.options.at("--tokenizer");
  } else {
    const ckpt::CheckpointReader reader(dir, /*verify=*/false);
    options.tokenizer_path = reader.state().value("tokenizer_path", std::string());
  }
  const std::unique_ptr<Tokenizer> tokenizer = build_tokenizer(options.tokenizer_path);
  options.bos_id = tokenizer->bos_id();
  options.eos_id = tokenizer->eos_id();
  ckpt::checkpoint_to_hf(dir, args.positional[1], options, args.merge_lora);
  std::printf("wrote Hugging Face folder %s from %s\n", args.positional[1].c_str(), dir.c_str());
  return 0;
}

int from_hf(const Args& args) {
  if (!ckpt::is_hf_folder(args.positional[0])) {
    throw ConfigError(
        message("'", args.positional[0], "' is not a Hugging Face folder (no config.json)"));
  }
  const auto adapter = args.options.find("--adapter");
  ckpt::hf_to_checkpoint(args.positional[0], args.positional[1],
                         adapter == args.options.end() ? "" : adapter->second);
  std::printf("wrote checkpoint %s from %s\n", args.positional[1].c_str(),
              args.positional[0].c_str());
  return 0;
}

std::vector<int64_t> parse_id_list(const std::string& text) {
  std::string bad;
  const auto ids = parse_int_list(text, &bad);
  if (!ids) throw ConfigError(message("--ids: '", bad, "' is not a token id"));
  for (int64_t id : *ids) {
    if (id < 0) throw ConfigError(message("--ids: '", id, "' is not a token id"));
  }
  if (ids->empty()) throw ConfigError("--ids needs at least one token id");
  return *ids;
}

int logits(const Args& args) {
  if (!args.options.count("--ids")) {
    Args unused;
    throw ConfigError(message("logits needs --ids\n", convert_flags("logits", unused).usage()));
  }
  const std::vector<int64_t> ids = parse_id_list(args.options.at("--ids"));
  const auto n = static_cast<int64_t>(ids.size());
  const ckpt::LoadedModel loaded = ckpt::load_model(args.positional[0], at::kFloat, n);
  at::NoGradGuard no_grad;
  const at::Tensor tokens = at::tensor(ids, at::kLong).view({1, n});
  const int64_t vocab = loaded.model->stats(1, n).vocab_size;
  for (int64_t id : ids) {
    if (id >= vocab) {
      throw ConfigError(message("--ids: ", id, " is outside the vocabulary (", vocab, " tokens)"));
    }
  }
  const at::Tensor out = loaded.model->forward(tokens)[0].to(at::kFloat).contiguous();
  if (args.options.count("--out")) {
    std::vector<std::pair<std::string, at::Tensor>> written = {{"logits", out}};
    const std::vector<at::Tensor> depths = loaded.model->mtp_logits(tokens);
    for (size_t k = 0; k < depths.size(); ++k) {
      written.emplace_back("mtp_logits_" + std::to_string(k + 1), depths[k][0].contiguous());
    }
    ckpt::write_safetensors(args.options.at("--out"), written);
    std::printf("wrote logits (%lld, %lld) of %s to %s\n", static_cast<long long>(out.size(0)),
                static_cast<long long>(out.size(1)), loaded.source.c_str(),
                args.options.at("--out").c_str());
  } else {
    const auto [values, indices] = out.max(-1);
    for (int64_t t = 0; t < n; ++t) {
      std::printf("%lld %lld %.6f\n", static_cast<long long>(t),
                  static_cast<long long>(indices[t].item<int64_t>()), values[t].item<float>());
    }
  }
  return 0;
}

// The model tensors of a checkpoint or HF folder, in our names and their stored dtypes.
TensorMap tensors_of(const std::string& path) {
  if (ckpt::is_hf_folder(path)) {
    const ckpt::HfFolderReader reader(path);
    const nlohmann::json description =
        ckpt::hf_model_description(reader.config(), path + "/config.json", reader.names());
    return spec_for_description(description)
        .hf.from_hf(reader.read_all(at::ScalarType::Undefined), description);
  }
  return ckpt::read_model_tensors(ckpt::CheckpointReader(resolve_checkpoint_dir(path)));
}

bool bit_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const at::Tensor x = a.contiguous();
  const at::Tensor y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

double tolerance_option(const Args& args, const std::string& name) {
  const auto it = args.options.find(name);
  if (it == args.options.end()) return 0.0;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0' || !(v >= 0)) {
    throw ConfigError(message(name, " must be a non-negative number, got '", it->second, "'"));
  }
  return v;
}

int diff(const Args& args) {
  const double atol = tolerance_option(args, "--atol");
  const double rtol = tolerance_option(args, "--rtol");
  const bool exact = atol == 0 && rtol == 0;
  const TensorMap a = tensors_of(args.positional[0]);
  const TensorMap b = tensors_of(args.positional[1]);
  int64_t differing = 0;
  double max_diff = 0;
  for (const auto& [name, ta] : a) {
    const auto it = b.find(name);
    if (it == b.end()) {
      std::printf("only in A: %s\n", name.c_str());
      ++differing;
    } else if (exact ? !bit_equal(ta, it->second)
                     : ta.sizes() != it->second.sizes() ||
                           !at::allclose(ta.to(at::kDouble), it->second.to(at::kDouble), rtol,
                                         atol)) {
      std::ostringstream os;
      os << name << ": A " << ta.scalar_type() << " " << ta.sizes() << ", B "
         << it->second.scalar_type() << " " << it->second.sizes();
      if (ta.sizes() == it->second.sizes()) {
        os << ", max |A - B| = "
           << (ta.to(at::kDouble) - it->second.to(at::kDouble)).abs().max().item<double>();
      }
      std::printf("differs: %s\n", os.str().c_str());
      ++differing;
    }
  }
  for (const auto& [name, tb] : b) {
    if (a.count(name) == 0) {
      std::printf("only in B: %s\n", name.c_str());
      ++differing;
    }
  }
  if (differing == 0) {
    if (exact) {
      std::printf("identical: %zu tensors\n", a.size());
    } else {
      for (const auto& [name, ta] : a) {
        max_diff = std::max(
            max_diff, (ta.to(at::kDouble) - b.at(name).to(at::kDouble)).abs().max().item<double>());
      }
      std::printf("close: %zu tensors within atol %g + rtol %g (max |A - B| = %g)\n", a.size(),
                  atol, rtol, max_diff);
    }
    return 0;
  }
  std::printf("%lld of %zu tensors differ\n", static_cast<long long>(differing),
              std::max(a.size(), b.size()));
  return 1;
}

}  // namespace

int run_convert(const std::vector<std::string>& argv) {
  if (FlagTable::wants_help(argv)) {
    Args unused;
    std::fputs(actions_usage(convert_actions(unused)).c_str(), stdout);
    return 0;
  }
  const Args args = parse_args(argv);
  if (args.action == "to-hf") return to_hf(args);
  if (args.action == "to-peft") {
    const std::string dir = resolve_checkpoint_dir(args.positional[0]);
    ckpt::checkpoint_to_peft(dir, args.positional[1]);
    std::printf("wrote PEFT adapter folder %s from %s\n", args.positional[1].c_str(), dir.c_str());
    return 0;
  }
  if (args.action == "from-hf") return from_hf(args);
  if (args.action == "logits") return logits(args);
  return diff(args);
}

}  // namespace titan
