// Llama 3 decoder modules and TorchTitan's weight init (see model.h).
#include "titan/models/llama3/model.h"

#include "titan/common/check.h"
#include "titan/models/common/init.h"

#include <ATen/core/grad_mode.h>

#include <cmath>
#include <string>

namespace titan::llama3 {

TransformerBlock::TransformerBlock(int64_t layer_id, const Llama3Args& args,
                                   at::ScalarType compute_dtype) {
  attention = register_module("attention",
                              std::make_shared<Attention>(args.dim, args.n_heads, args.kv_heads(),
                                                          args.head_dim(), compute_dtype));
  feed_forward = register_module(
      "feed_forward",
      std::make_shared<FeedForward>(args.dim, args.ffn_hidden_dim(), compute_dtype));
  attention_norm =
      register_module("attention_norm", std::make_shared<RMSNorm>(args.dim, args.norm_eps));
  ffn_norm = register_module("ffn_norm", std::make_shared<RMSNorm>(args.dim, args.norm_eps));
  const double depth = args.depth_init ? 2.0 * (layer_id + 1) : 2.0 * args.n_layers;
  weight_init_std = 0.02 / std::sqrt(depth);
}

at::Tensor TransformerBlock::forward(const at::Tensor& x, const RotaryEmbedding& rope,
                                     const at::Tensor& positions, const KVCacheStep* cache) {
  // x is in residual_dtype(compute_dtype); were it float32 under bf16 compute, the sums would
  // promote and keep it float32.
  const at::Tensor h = x + attention->forward(attention_norm->forward(x), rope, positions, cache);
  return h + feed_forward->forward(ffn_norm->forward(h));
}

ParamInit TransformerBlock::param_init(const std::string& name) const {
  if (name == "attention_norm.weight" || name == "ffn_norm.weight") return ParamInit::ones();
  if (name == "attention.wq.weight" || name == "attention.wk.weight" ||
      name == "attention.wv.weight" || name == "feed_forward.w1.weight") {
    return ParamInit::trunc_normal(/*mean=*/0.0, /*std=*/0.02);
  }
  if (name == "attention.wo.weight" || name == "feed_forward.w2.weight" ||
      name == "feed_forward.w3.weight") {
    return ParamInit::trunc_normal(/*mean=*/0.0, /*std=*/weight_init_std);
  }
  TITAN_CHECK(false, "llama3 block: no init for parameter '", name, "'");
  return {};
}

Transformer::Transformer(const Llama3Args& args, at::ScalarType compute_dtype)
    : args_(args), compute_dtype_(compute_dtype) {
  args_.validate();
  tok_embeddings =
      register_module("tok_embeddings", std::make_shared<Embedding>(args.vocab_size, args.dim));
  rope = register_module("rope", std::make_shared<RotaryEmbedding>(
                                     args.head_dim(), args.max_seq_len, args.rope_theta,
                                     args.use_rope_scaling ? &args.rope_scaling : nullptr));
  auto layer_list = register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < args.n_layers; ++i) {
    layers.push_back(layer_list->register_module(
        std::to_string(i), std::make_shared<TransformerBlock>(i, args, compute_dtype)));
  }
  norm = register_module("norm", std::make_shared<RMSNorm>(args.dim, args.norm_eps));
  if (!args.tie_embeddings) {
    output = register_module("output",
                             std::make_shared<Linear>(args.dim, args.vocab_size, compute_dtype));
  }
}

at::Tensor Transformer::embed(const at::Tensor& tokens) {
  const at::Tensor h = tok_embeddings->forward(tokens);  // (bs, seqlen, dim)
  const at::ScalarType residual = residual_dtype(compute_dtype_);
  return is_reduced_float(residual) ? h.to(residual) : h;
}

at::Tensor Transformer::head(const at::Tensor& h) {
  const at::Tensor hn = norm->forward(h);
  const at::Tensor logits = output ? output->forward(hn)  // (bs, seqlen, vocab)
                                   : mixed_linear(hn, tok_embeddings->weight, compute_dtype_);
  return is_reduced_float(logits.scalar_type()) ? logits.to(at::kFloat) : logits;
}

at::Tensor Transformer::forward(const at::Tensor& tokens) {
  // Unit functions capture by value: a runner may call them again during backward.
  at::Tensor h = run_unit(0, tokens, [this](const at::Tensor& x) { return embed(x); });
  for (size_t i = 0; i < layers.size(); ++i) {
    TransformerBlock* block = layers[i].get();
    const RotaryEmbedding* table = rope.get();
    h = run_unit(static_cast<int64_t>(i) + 1, h,
                 [block, table](const at::Tensor& x) { return block->forward(x, *table); });
  }
  const int64_t head_unit = output ? static_cast<int64_t>(layers.size()) + 1 : 0;
  return run_unit(head_unit, h, [this](const at::Tensor& x) { return head(x); });
}

std::vector<ModelUnit> Transformer::units() const {
  std::vector<ModelUnit> out;
  out.push_back({"tok_embeddings", {"tok_embeddings.weight"}});
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string prefix = "layers." + std::to_string(i) + ".";
    ModelUnit unit{"layers." + std::to_string(i), {}};
    unit.block = static_cast<int64_t>(i);
    for (const auto& item : layers[i]->named_parameters())
      unit.params.push_back(prefix + item.key());
    out.push_back(std::move(unit));
  }
  if (output) {
    out.push_back({"norm, output", {"norm.weight", "output.weight"}});
  } else {
    out[0].name = "tok_embeddings, norm (tied output)";
    out[0].params.push_back("norm.weight");
    out[0].reused_in_forward = true;
  }
  return out;
}

at::Tensor Transformer::forward_cached(const at::Tensor& tokens, KVCache& cache,
                                       int64_t start_pos) {
  // The cache is written in place; autograd must not record (or keep alive) any of it.
  at::NoGradGuard no_grad;
  TITAN_CHECK(start_pos >= 0 && start_pos <= cache.length, "start_pos ", start_pos,
              " would leave a gap after the ", cache.length, " cached positions");
  at::Tensor h = embed(tokens);  // (bs, n, dim)
  // The new tokens' absolute positions, once for every layer.
  const at::Tensor positions = at::arange(start_pos, start_pos + tokens.size(1),
                                          at::TensorOptions(at::kLong).device(tokens.device()));
  for (size_t i = 0; i < layers.size(); ++i) {
    const KVCacheStep step{&cache.layer(i), start_pos, cache.max_len};
    h = layers[i]->forward(h, *rope, positions, &step);
  }
  cache.length = start_pos + tokens.size(1);
  return head(h);
}

ParamInit Transformer::param_init(const std::string& name) const {
  // The head gets a small, truncated std; with tied embeddings that is the embedding's init too,
  // as in TorchTitan (whose head init overwrites the embedding's).
  const double head_std = 1.0 / std::sqrt(static_cast<double>(args_.dim));
  const ParamInit head =
      ParamInit::trunc_normal(/*mean=*/0.0, head_std, -3 * head_std, 3 * head_std);
  if (name == "tok_embeddings.weight") {
    return output ? ParamInit::normal(/*mean=*/0.0, /*std=*/1.0) : head;
  }
  if (name == "output.weight") return head;
  if (name == "norm.weight") return ParamInit::ones();
  const std::string prefix = "layers.";
  if (name.compare(0, prefix.size(), prefix) == 0) {
    const size_t dot = name.find('.', prefix.size());
    if (dot != std::string::npos) {
      const int64_t layer = std::stoll(name.substr(prefix.size(), dot - prefix.size()));
      if (layer >= 0 && layer < static_cast<int64_t>(layers.size())) {
        return layers[layer]->param_init(name.substr(dot + 1));
      }
    }
  }
  TITAN_CHECK(false, "llama3: no init for parameter '", name, "'");
  return {};
}

ModelStats Transformer::stats(int64_t batch, int64_t seq_len) const {
  return compute_stats(args_, batch, seq_len, compute_dtype_);
}

}  // namespace titan::llama3
