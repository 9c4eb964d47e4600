// Llama 3 decoder modules and TorchTitan's weight init (see model.h).
#include "titan/models/llama3/model.h"

#include "titan/common/check.h"
#include "titan/kernels/cross_entropy.h"
#include "titan/models/common/fused_loss.h"
#include "titan/models/common/init.h"
#include "titan/models/llama3/hf_adapter.h"
#include "titan/models/registry.h"

#include <ATen/core/grad_mode.h>

#include <cmath>
#include <map>
#include <set>
#include <string>

namespace titan::llama3 {
namespace {

// TorchTitan's std for a block's output projections (wo, w2, w3).
double block_init_std(const Llama3Args& args, int64_t layer_id) {
  const double depth = args.depth_init ? 2.0 * (layer_id + 1) : 2.0 * args.n_layers;
  return 0.02 / std::sqrt(depth);
}

// The init of a block parameter `name` (relative to the block), see TransformerBlock::param_init.
// MoE blocks (TorchTitan's MoE init): the first expert projection and the shared experts' w1 at
// 0.02, the router and the other expert projections at the block's output std.
ParamInit block_param_init(const std::string& name, double weight_init_std,
                           const Llama3Args& args) {
  if (name == "attention_norm.weight" || name == "ffn_norm.weight" ||
      name == "attention.q_norm.weight" || name == "attention.k_norm.weight") {
    return args.zero_centered_norms ? ParamInit::zeros() : ParamInit::ones();
  }
  if (name == "attention.kv_norm.weight") return ParamInit::ones();
  // Qwen3-Next's linear attention: projections as attention's, the convolution as PyTorch's
  // default (kaiming-uniform bound 1 / sqrt(kernel)), dt_bias ones and A = exp(A_log) uniform in
  // log space over [1, 16] (Mamba-2's range), the gated norm's weight ones.
  if (name == "linear_attention.in_proj_qkvz.weight" ||
      name == "linear_attention.in_proj_ba.weight") {
    return ParamInit::trunc_normal(/*mean=*/0.0, /*std=*/0.02);
  }
  if (name == "linear_attention.out_proj.weight") {
    return ParamInit::trunc_normal(/*mean=*/0.0, /*std=*/weight_init_std);
  }
  if (name == "linear_attention.conv1d.weight") {
    const double bound = 1.0 / std::sqrt(static_cast<double>(args.linear.conv_kernel));
    return ParamInit::uniform(-bound, bound);
  }
  if (name == "linear_attention.dt_bias.weight" || name == "linear_attention.norm.weight") {
    return ParamInit::ones();
  }
  if (name == "linear_attention.A_log.weight") return ParamInit::uniform(0.0, std::log(16.0));
  // gpt-oss: biases start at zero (Hugging Face's init), sinks and the router bias as the
  // projections.
  if (name == "attention.bq.weight" || name == "attention.bk.weight" ||
      name == "attention.bv.weight" || name == "attention.bo.weight" ||
      name == "moe.experts.b1.weight" || name == "moe.experts.b2.weight" ||
      name == "moe.experts.b3.weight" || name == "moe.gate_bias.weight") {
    return ParamInit::zeros();
  }
  if (name == "attention.sinks.weight") {
    return ParamInit::trunc_normal(/*mean=*/0.0, /*std=*/0.02);
  }
  if (name == "attention.wq.weight" || name == "attention.wk.weight" ||
      name == "attention.wv.weight" || name == "attention.wq_a.weight" ||
      name == "attention.wq_b.weight" || name == "attention.wkv_a.weight" ||
      name == "attention.wkv_b.weight" || name == "feed_forward.w1.weight" ||
      name == "moe.experts.w1.weight" || name == "moe.shared_experts.w1.weight" ||
      name == "moe.shared_gate.weight") {
    return ParamInit::trunc_normal(/*mean=*/0.0, /*std=*/0.02);
  }
  if (name == "attention.wo.weight" || name == "feed_forward.w2.weight" ||
      name == "feed_forward.w3.weight" || name == "moe.gate.weight" ||
      name == "moe.experts.w2.weight" || name == "moe.experts.w3.weight" ||
      name == "moe.shared_experts.w2.weight" || name == "moe.shared_experts.w3.weight") {
    return ParamInit::trunc_normal(/*mean=*/0.0, /*std=*/weight_init_std);
  }
  TITAN_CHECK(false, "llama3 block: no init for parameter '", name, "'");
  return {};
}

std::string layer_name(int64_t layer_id) { return "layers." + std::to_string(layer_id); }

}  // namespace

MtpModule::MtpModule(int64_t depth, const Llama3Args& args, at::ScalarType compute_dtype) {
  enorm = register_module("enorm", std::make_shared<RMSNorm>(args.dim, args.norm_eps));
  hnorm = register_module("hnorm", std::make_shared<RMSNorm>(args.dim, args.norm_eps));
  eh_proj =
      register_module("eh_proj", std::make_shared<Linear>(2 * args.dim, args.dim, compute_dtype));
  block = register_module(
      "block", std::make_shared<TransformerBlock>(args.mtp_layer_id(depth), args, compute_dtype));
  norm = register_module("norm", std::make_shared<RMSNorm>(args.dim, args.norm_eps));
}

at::Tensor MtpModule::forward(const at::Tensor& x, const RotaryEmbedding& rope,
                              const at::Tensor& positions, const at::Tensor& document_ids) {
  const int64_t dim = x.size(-1) / 2;
  const at::Tensor joined =
      at::cat({enorm->forward(x.narrow(-1, 0, dim)), hnorm->forward(x.narrow(-1, dim, dim))}, -1);
  at::Tensor h = eh_proj->forward(joined);
  if (h.scalar_type() != x.scalar_type()) h = h.to(x.scalar_type());  // the residual dtype
  return norm->forward(block->forward(h, rope, positions, /*cache=*/nullptr, document_ids));
}

at::Tensor mtp_targets(const at::Tensor& targets, const at::Tensor& document_ids, int64_t depth) {
  TITAN_CHECK(targets.dim() == 2 && depth >= 1, "mtp_targets: targets (bs, seqlen), depth >= 1");
  const int64_t seq = targets.size(1);
  at::Tensor kept = at::arange(seq, targets.options()).lt(seq - depth).unsqueeze(0);
  if (document_ids.defined()) {
    kept = kept & document_ids.eq(at::roll(document_ids, -depth, 1));
  }
  return at::where(kept, at::roll(targets, -depth, 1),
                   at::full({}, kernels::kIgnoreIndex, targets.options()));
}

TransformerBlock::TransformerBlock(int64_t layer_id, const Llama3Args& args,
                                   at::ScalarType compute_dtype) {
  if (args.is_linear_attention_layer(layer_id)) {
    GatedDeltaNetArgs linear = args.linear;
    linear.norm_eps = args.norm_eps;
    linear_attention = register_module(
        "linear_attention", std::make_shared<GatedDeltaNet>(args.dim, linear, compute_dtype));
  } else if (args.mla.enabled()) {
    latent_attention =
        register_module("attention", std::make_shared<MultiHeadLatentAttention>(
                                         args.dim, args.n_heads, args.mla, compute_dtype));
  } else {
    AttentionExtras extras;
    extras.bias = args.attention_bias;
    extras.sinks = args.attention_sinks;
    extras.window = args.is_sliding_layer(layer_id) ? args.sliding_window : 0;
    // Llama 4: NoPE layers attend globally with temperature-tuned queries; the RoPE layers
    // within chunks, with the L2 qk norm.
    const bool nope = args.is_nope_layer(layer_id);
    extras.rope = !nope;
    extras.chunk = args.layer_attention_chunk(layer_id);
    extras.l2_qk_norm = args.qk_l2_norm && !nope;
    extras.l2_norm_eps = args.norm_eps;
    extras.temperature_floor = nope ? args.attn_temperature_floor : 0;
    extras.temperature_scale = args.attn_temperature_scale;
    // Qwen3-Next: the gated output, partial RoPE, zero-centred q/k norms.
    extras.output_gate = args.attention_output_gate;
    extras.rope_dim = args.partial_rotary_factor != 1.0 ? args.rope_dim() : 0;
    extras.zero_centered_norm = args.zero_centered_norms;
    if (args.yarn.enabled()) {
      const double m = yarn_mscale(args.yarn.factor, 1.0);
      extras.softmax_scale = m * m / std::sqrt(static_cast<double>(args.head_dim()));
    }
    attention = register_module(
        "attention",
        std::make_shared<Attention>(args.dim, args.n_heads, args.kv_heads(), args.head_dim(),
                                    compute_dtype, args.qk_norm, args.norm_eps, extras));
  }
  if (args.is_moe_layer(layer_id)) {
    moe = register_module("moe", std::make_shared<MoE>(args.dim, args.moe, compute_dtype));
  } else {
    feed_forward = register_module(
        "feed_forward",
        std::make_shared<FeedForward>(args.dim, args.ffn_hidden_dim(), compute_dtype));
  }
  attention_norm =
      register_module("attention_norm",
                      std::make_shared<RMSNorm>(args.dim, args.norm_eps, args.zero_centered_norms));
  ffn_norm = register_module(
      "ffn_norm", std::make_shared<RMSNorm>(args.dim, args.norm_eps, args.zero_centered_norms));
  this->layer_id = layer_id;
  args_ = args;
  weight_init_std = block_init_std(args, layer_id);
}

at::Tensor TransformerBlock::forward(const at::Tensor& x, const RotaryEmbedding& rope,
                                     const at::Tensor& positions, const KVCacheStep* cache,
                                     const at::Tensor& document_ids) {
  // x is in residual_dtype(compute_dtype); were it float32 under bf16 compute, the sums would
  // promote and keep it float32.
  const at::Tensor xn = attention_norm->forward(x);
  at::Tensor attended;
  if (linear_attention) {
    // Generation carries the layer's state in its cache entry (a new sequence at position 0).
    LinearAttentionState* state = nullptr;
    if (cache != nullptr) {
      state = &cache->cache->linear;
      if (cache->start_pos == 0) *state = LinearAttentionState{};
    }
    attended = linear_attention->forward(xn, document_ids, state).to(x.scalar_type());
  } else if (attention) {
    attended = attention->forward(xn, rope, positions, cache, document_ids);
  } else {
    attended = latent_attention->forward(xn, rope, positions, cache, document_ids);
  }
  // h = x + attended and its norm, one fused kernel where the norm takes one (compile.enable).
  const auto [h, hn] = ffn_norm->forward_add(x, attended);
  return h + (moe ? moe->forward(hn) : feed_forward->forward(hn));
}

ParamInit TransformerBlock::param_init(const std::string& name) const {
  return block_param_init(name, weight_init_std, args_);
}

Transformer::Transformer(const Llama3Args& args, at::ScalarType compute_dtype)
    : args_(args), compute_dtype_(compute_dtype) {
  args_.validate();
  tok_embeddings =
      register_module("tok_embeddings", std::make_shared<Embedding>(args.vocab_size, args.dim));
  rope = register_module(
      "rope", args.mla.enabled()
                  ? std::make_shared<RotaryEmbedding>(args.mla.qk_rope_head_dim, args.max_seq_len,
                                                      args.rope_theta, args.mla.yarn)
              : args.yarn.enabled()
                  ? std::make_shared<RotaryEmbedding>(args.head_dim(), args.max_seq_len,
                                                      args.rope_theta, args.yarn)
                  : std::make_shared<RotaryEmbedding>(
                        args.rope_dim(), args.max_seq_len, args.rope_theta,
                        args.use_rope_scaling ? &args.rope_scaling : nullptr));
  layer_list_ = register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = 0; i < args.n_layers; ++i) {
    layers.push_back(layer_list_->register_module(
        std::to_string(i), std::make_shared<TransformerBlock>(i, args, compute_dtype)));
  }
  norm = register_module(
      "norm", std::make_shared<RMSNorm>(args.dim, args.norm_eps, args.zero_centered_norms));
  if (!args.tie_embeddings) {
    output = register_module("output",
                             std::make_shared<Linear>(args.dim, args.vocab_size, compute_dtype));
  }
  if (args.num_mtp_layers > 0) {
    auto list = register_module("mtp", std::make_shared<torch::nn::Module>());
    for (int64_t depth = 1; depth <= args.num_mtp_layers; ++depth) {
      mtp.push_back(list->register_module(std::to_string(depth - 1),
                                          std::make_shared<MtpModule>(depth, args, compute_dtype)));
    }
  }
}

bool Transformer::is_whole() const {
  return tok_embeddings && norm && static_cast<int64_t>(layers.size()) == args_.n_layers;
}

at::Tensor Transformer::embed(const at::Tensor& tokens) {
  TITAN_CHECK(tok_embeddings, "llama3: embed on a pipeline stage without tok_embeddings");
  const at::Tensor h = tok_embeddings->forward(tokens);  // (bs, seqlen, dim)
  const at::ScalarType residual = residual_dtype(compute_dtype_);
  return is_reduced_float(residual) ? h.to(residual) : h;
}

at::Tensor Transformer::embed_units(const at::Tensor& tokens, const ForwardInputs& /*inputs*/,
                                    int64_t& unit) {
  // Unit functions capture by value: a runner may call them again during backward.
  return run_unit(unit++, tokens, [this](const at::Tensor& x) { return embed(x); });
}

at::Tensor Transformer::head(const at::Tensor& h, const at::Tensor& labels) {
  TITAN_CHECK(norm, "llama3: head on a pipeline stage without norm and output");
  return project(norm->forward(h), labels);
}

at::Tensor Transformer::project(const at::Tensor& hn, const at::Tensor& labels) {
  if (labels.defined()) {  // the fused linear + cross-entropy (model.h)
    return output ? output->forward_loss(hn, labels)
                  : fused_linear_cross_entropy(hn, tok_embeddings->weight, labels, compute_dtype_);
  }
  const at::Tensor logits = output ? output->forward(hn)  // (bs, seqlen, vocab)
                                   : mixed_linear(hn, tok_embeddings->weight, compute_dtype_);
  return is_reduced_float(logits.scalar_type()) ? logits.to(at::kFloat) : logits;
}

at::Tensor Transformer::run_forward(const at::Tensor& tokens, const ForwardInputs& inputs) {
  // Unit indices follow units(): the present modules in order.
  int64_t unit = 0;
  at::Tensor h;  // (bs, seqlen, dim) in the residual dtype
  if (tok_embeddings) {
    h = embed_units(tokens, inputs, unit);
  } else {
    const at::ScalarType residual = residual_dtype(compute_dtype_);
    TITAN_CHECK(tokens.dim() == 3 && tokens.size(2) == args_.dim && tokens.is_floating_point() &&
                    (!is_reduced_float(residual) || tokens.scalar_type() == residual),
                "llama3 pipeline stage without tok_embeddings: expected the previous stage's "
                "hidden state (bs, seqlen, ",
                args_.dim, ") in ", residual, ", got ", tokens.sizes(), " ", tokens.scalar_type(),
                ". HINT: pass the previous stage's output unchanged");
    h = tokens;
  }
  const at::Tensor positions = inputs.positions;  // undefined: 0 .. seqlen - 1
  const at::Tensor docs = inputs.document_ids;    // undefined: causal
  for (const auto& layer : layers) {
    TransformerBlock* block = layer.get();
    const RotaryEmbedding* table = rope.get();
    h = run_unit(unit++, h, [block, table, positions, docs](const at::Tensor& x) {
      return block->forward(x, *table, positions, /*cache=*/nullptr, docs);
    });
  }
  if (!norm) return h;
  // Tied: the embedding's unit runs again.
  const int64_t head_unit = output ? unit++ : embedding_unit();
  const at::Tensor labels = inputs.loss_labels;  // defined: the fused loss (model.h)
  const at::Tensor out =
      run_unit(head_unit, h, [this, labels](const at::Tensor& x) { return head(x, labels); });
  if (mtp.empty() || !inputs.targets.defined() || inputs.auxiliary_losses == nullptr) return out;

  // Multi-token prediction: depth k embeds the tokens k ahead (rolled: the last k positions read
  // wrapped tokens, and predict nothing), joins them to depth k - 1's h and predicts the targets
  // k ahead through the shared head. The embedding and the head run as their units again.
  TITAN_CHECK(is_whole(), "llama3: multi-token prediction needs the whole model");
  const bool fused = labels.defined();
  // Depth 1 reads the main model's final hidden state after its norm (transformers' MtpModel
  // takes hidden_states[-1], the normed one; vLLM's DeepSeek MTP the same).
  at::Tensor hidden =
      run_unit(head_unit, h, [this](const at::Tensor& x) { return norm->forward(x); });
  for (size_t j = 0; j < mtp.size(); ++j) {
    const auto depth = static_cast<int64_t>(j + 1);
    const at::Tensor embedded = run_unit(embedding_unit(), at::roll(tokens, -depth, 1),
                                         [this](const at::Tensor& x) { return embed(x); });
    MtpModule* module = mtp[j].get();
    const RotaryEmbedding* table = rope.get();
    hidden = run_unit(unit + static_cast<int64_t>(j), at::cat({embedded, hidden}, -1),
                      [module, table, positions, docs](const at::Tensor& x) {
                        return module->forward(x, *table, positions, docs);
                      });
    const at::Tensor targets = mtp_targets(inputs.targets, docs, depth);
    // The fused loss, or the logits.
    at::Tensor loss = run_unit(head_unit, hidden, [this, fused, targets](const at::Tensor& x) {
      return project(x, fused ? targets : at::Tensor());
    });
    if (!fused) {
      const at::Tensor mean =
          at::cross_entropy_loss(loss.flatten(0, 1), targets.flatten(),
                                 /*weight=*/{}, at::Reduction::Mean, kernels::kIgnoreIndex);
      // No predicted token: 0 (ATen's mean is 0 / 0 there; its gradient is zero).
      loss = at::where(targets.ne(kernels::kIgnoreIndex).any(), mean, at::zeros_like(mean));
    }
    inputs.auxiliary_losses->push_back({"mtp_loss", loss, targets});
  }
  return out;
}

std::vector<at::Tensor> Transformer::mtp_logits(const at::Tensor& tokens) {
  if (mtp.empty()) return {};
  TITAN_CHECK(is_whole(), "llama3: multi-token prediction needs the whole model");
  at::NoGradGuard no_grad;
  at::Tensor h = embed(tokens);
  for (const auto& layer : layers) h = layer->forward(h, *rope);
  at::Tensor hidden = norm->forward(h);
  std::vector<at::Tensor> out;
  for (size_t j = 0; j < mtp.size(); ++j) {
    const at::Tensor ahead = at::roll(tokens, -static_cast<int64_t>(j + 1), 1);
    hidden = mtp[j]->forward(at::cat({embed(ahead), hidden}, -1), *rope, {}, {});
    out.push_back(project(hidden, {}).to(at::kFloat));
  }
  return out;
}

std::string Transformer::refuses(const std::string& parallelism) const {
  if (args_.full_attention_interval > 0 && parallelism == "context") {
    return "context parallelism would pass the linear-attention layers' recurrent state and "
           "convolution history from rank to rank along the sequence, which is not built yet. "
           "HINT: use FSDP, HSDP, DDP, TP, PP and EP, or shorter sequences";
  }
  if (mtp.empty()) return {};
  std::string why;
  if (parallelism == "pipeline") {
    why = "its depths run after the head and use the first stage's embedding";
  } else if (parallelism == "tensor") {
    why = "its depths' cross-entropy takes whole-vocabulary logits (no loss parallel yet)";
  } else if (parallelism == "context") {
    why = "depth k reads the tokens k positions ahead, which lie on the next rank's shard";
  } else {
    return {};
  }
  return "multi-token prediction (num_mtp_layers = " + std::to_string(mtp.size()) +
         ") does not compose with " + parallelism + " parallelism yet: " + why +
         ". HINT: train it with data parallelism (FSDP, HSDP, DDP) and expert parallelism, or "
         "use a flavor without multi-token prediction";
}

std::vector<ModelUnit> Transformer::units() const {
  std::vector<ModelUnit> out;
  if (tok_embeddings) out.push_back({"tok_embeddings", {"tok_embeddings.weight"}});
  for (const auto& layer : layers) {
    const std::string prefix = layer_name(layer->layer_id) + ".";
    ModelUnit unit{layer_name(layer->layer_id), {}};
    unit.block = layer->layer_id;
    for (const auto& item : layer->named_parameters()) unit.params.push_back(prefix + item.key());
    out.push_back(std::move(unit));
  }
  if (output) {
    out.push_back({"norm, output", {"norm.weight", "output.weight"}});
  } else if (norm) {
    out[0].name = "tok_embeddings, norm (tied output)";
    out[0].params.push_back("norm.weight");
    out[0].reused_in_forward = true;
  }
  if (!mtp.empty()) {  // a whole model: the embedding and the head run once more per depth
    out.front().reused_in_forward = true;
    if (output) out.back().reused_in_forward = true;
  }
  for (size_t j = 0; j < mtp.size(); ++j) {
    const std::string name = "mtp." + std::to_string(j);
    ModelUnit unit{name, {}};
    unit.block = args_.mtp_layer_id(static_cast<int64_t>(j + 1));
    for (const auto& item : mtp[j]->named_parameters())
      unit.params.push_back(name + "." + item.key());
    out.push_back(std::move(unit));
  }
  return out;
}

at::Tensor Transformer::forward_cached(const at::Tensor& tokens, KVCache& cache,
                                       int64_t start_pos) {
  TITAN_CHECK(tok_embeddings,
              "llama3: KV-cache inference needs the whole model, not a pipeline stage");
  // The cache is written in place; autograd must not record (or keep alive) any of it.
  at::NoGradGuard no_grad;
  return forward_cached_embedded(embed(tokens), cache, start_pos);
}

at::Tensor Transformer::forward_cached_embedded(const at::Tensor& embedded, KVCache& cache,
                                                int64_t start_pos) {
  TITAN_CHECK(is_whole(), "llama3: KV-cache inference needs the whole model, not a pipeline stage");
  at::NoGradGuard no_grad;
  TITAN_CHECK(start_pos >= 0 && start_pos <= cache.length, "start_pos ", start_pos,
              " would leave a gap after the ", cache.length, " cached positions");
  TITAN_CHECK(args_.full_attention_interval == 0 || start_pos == 0 || start_pos == cache.length,
              "start_pos ", start_pos, " rewinds a cache of ", cache.length,
              " positions, which the linear-attention layers' recurrent state cannot. HINT: "
              "start again at position 0");
  at::Tensor h = embedded;  // (bs, n, dim)
  for (size_t i = 0; i < layers.size(); ++i) {
    // No positions: the cache step's [start_pos, start_pos + n), rows of the RoPE tables.
    const KVCacheStep step{&cache.layer(i), start_pos, cache.max_len};
    h = layers[i]->forward(h, *rope, /*positions=*/{}, &step);
  }
  cache.length = start_pos + embedded.size(1);
  return head(h, /*labels=*/{});
}

ParamInit Transformer::param_init(const std::string& name) const {
  // The head gets a small, truncated std; with tied embeddings that is the embedding's init too,
  // as in TorchTitan (whose head init overwrites the embedding's).
  const double head_std = 1.0 / std::sqrt(static_cast<double>(args_.dim));
  const ParamInit head =
      ParamInit::trunc_normal(/*mean=*/0.0, head_std, -3 * head_std, 3 * head_std);
  if (name == "tok_embeddings.weight") {
    return args_.tie_embeddings ? head : ParamInit::normal(/*mean=*/0.0, /*std=*/1.0);
  }
  if (name == "output.weight") return head;
  if (name == "norm.weight") {
    return args_.zero_centered_norms ? ParamInit::zeros() : ParamInit::ones();
  }
  int64_t index = 0;
  std::string rest;
  if (parse_layer_name(name, "mtp.", index, rest) && index < args_.num_mtp_layers) {
    if (rest == "enorm.weight" || rest == "hnorm.weight" || rest == "norm.weight") {
      return ParamInit::ones();
    }
    if (rest == "eh_proj.weight") return ParamInit::trunc_normal(/*mean=*/0.0, /*std=*/0.02);
    const std::string block = "block.";
    if (rest.compare(0, block.size(), block) == 0) {
      const int64_t layer = args_.mtp_layer_id(index + 1);
      return block_param_init(rest.substr(block.size()), block_init_std(args_, layer), args_);
    }
  }
  const std::string prefix = "layers.";
  if (name.compare(0, prefix.size(), prefix) == 0) {
    const size_t dot = name.find('.', prefix.size());
    if (dot != std::string::npos) {
      const int64_t layer = std::stoll(name.substr(prefix.size(), dot - prefix.size()));
      if (layer >= 0 && layer < args_.n_layers) {
        return block_param_init(name.substr(dot + 1), block_init_std(args_, layer), args_);
      }
    }
  }
  TITAN_CHECK(false, "llama3: no init for parameter '", name, "'");
  return {};
}

ModelStats Transformer::stats(int64_t batch, int64_t seq_len) const {
  return compute_stats(args_, batch, seq_len, compute_dtype_);
}

std::vector<std::string> Transformer::stage_modules() const {
  // With tied embeddings `output` names the head that reuses tok_embeddings.weight.
  std::vector<std::string> present;
  if (tok_embeddings) present.push_back("tok_embeddings");
  for (const auto& layer : layers) present.push_back(layer_name(layer->layer_id));
  if (norm) {
    present.push_back("norm");
    present.push_back("output");
  }
  return present;
}

void Transformer::keep_modules(const std::set<std::string>& seen) {
  if (const std::string why = refuses("pipeline"); !why.empty()) throw ConfigError(why);
  const bool keep_norm = seen.count("norm") != 0, keep_output = seen.count("output") != 0;
  if (keep_norm != keep_output) {
    throw ConfigError(message(
        "llama3 pipeline stage: ", (keep_norm ? "norm without output" : "output without norm"),
        ". HINT: the final norm and the output projection form the head and stay "
        "in one stage"));
  }
  if (args_.tie_embeddings && seen.size() != stage_modules().size()) {
    throw ConfigError(
        "pipeline parallelism with tied embeddings (tie_embeddings = true) is not supported: the "
        "embedding and the output head share one weight, which a split into stages would "
        "separate (TorchTitan rejects weight tying with pipeline parallelism too). HINT: set "
        "tie_embeddings = false or parallelism.pipeline_parallel_degree = 1");
  }

  // Unregisters what is not kept: named_parameters() then lists the kept parameters under their
  // global names.
  if (tok_embeddings && seen.count("tok_embeddings") == 0) {
    unregister_module("tok_embeddings");
    tok_embeddings = nullptr;
  }
  std::vector<std::shared_ptr<TransformerBlock>> kept;
  for (auto& layer : layers) {
    const std::string name = layer_name(layer->layer_id);
    if (seen.count(name) != 0) {
      kept.push_back(std::move(layer));
    } else {
      layer_list_->unregister_module(std::to_string(layer->layer_id));
    }
  }
  layers = std::move(kept);
  if (norm && !keep_norm) {
    unregister_module("norm");
    norm = nullptr;
    if (output) {
      unregister_module("output");
      output = nullptr;
    }
  }
}

}  // namespace titan::llama3
