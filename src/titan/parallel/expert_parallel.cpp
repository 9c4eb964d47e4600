// Expert parallelism: experts split over the ep group, tokens exchanged by all-to-all (see
// expert_parallel.h).
#include "titan/parallel/expert_parallel.h"

#include "titan/common/check.h"
#include "titan/models/common/moe.h"
#include "titan/parallel/device_streams.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <numeric>
#include <sstream>

namespace titan {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct ExpertParallel::Stats {
  WaitClock clock{at::kCPU};
};

namespace {

// Rows of `x` to the group's ranks, send[j] rows to rank j, receiving recv[j] rows from rank j;
// on the group's device and back to x's.
at::Tensor exchange_rows(dist::Group& g, const at::Tensor& x, const std::vector<int64_t>& send,
                         const std::vector<int64_t>& recv, WaitClock& clock) {
  const int64_t rows = std::accumulate(recv.begin(), recv.end(), int64_t{0});
  std::vector<int64_t> shape = x.sizes().vec();
  shape[0] = rows;
  const at::Tensor in = x.to(g.device()).contiguous();
  at::Tensor out = at::empty(shape, in.options());
  dist::Work work = g.all_to_all_single(out, in, recv, send);
  clock.time([&] { work.wait(); });
  return out.to(x.device());
}

// Dispatch / combine: forward sends rows by `send` and receives by `recv`; backward sends the
// gradients back the way the rows came.
struct ExchangeRows : public torch::autograd::Function<ExchangeRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, dist::Group* g,
                            std::vector<int64_t> send, std::vector<int64_t> recv,
                            ExpertParallel::Stats* stats) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    ctx->saved_data["stats"] = reinterpret_cast<int64_t>(stats);
    ctx->saved_data["send"] = send;
    ctx->saved_data["recv"] = recv;
    return exchange_rows(*g, x, send, recv, stats->clock);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* g = reinterpret_cast<dist::Group*>(ctx->saved_data["group"].toInt());
    auto* stats = reinterpret_cast<ExpertParallel::Stats*>(ctx->saved_data["stats"].toInt());
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> recv = ctx->saved_data["recv"].toIntVector();
    return {exchange_rows(*g, grads[0], recv, send, stats->clock), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

// The MoE layer's runner under expert parallelism: this rank holds experts
// [rank * local, (rank + 1) * local) of the layer.
class AllToAllExperts final : public ExpertRunner {
 public:
  AllToAllExperts(std::shared_ptr<dist::Group> group, std::shared_ptr<ExpertParallel::Stats> stats)
      : group_(std::move(group)), stats_(std::move(stats)) {}

  at::Tensor run(GroupedExperts& experts, const at::Tensor& x,
                 const at::Tensor& device_counts) override {
    dist::Group& g = *group_;
    const int64_t ep = g.size();
    const int64_t local = experts.experts();
    TITAN_CHECK(device_counts.numel() == ep * local, "expert parallelism: ", device_counts.numel(),
                " token counts for ", ep, " ranks x ", local, " experts");
    // 1. Counts: got[s * local + e] rows will come from rank s for local expert e. The split
    // sizes of the exchange are host numbers: this layer's one host read brings both what this
    // rank sends and what it gets.
    const at::Tensor sent_counts = device_counts.to(g.device(), at::kLong).contiguous();
    at::Tensor got_counts = at::empty_like(sent_counts);
    dist::Work work = g.all_to_all_single(got_counts, sent_counts);
    stats_->clock.time([&] { work.wait(); });
    const std::vector<int64_t> both = host_counts(at::cat({sent_counts, got_counts}));
    const std::vector<int64_t> counts(both.begin(), both.begin() + ep * local);
    const int64_t* got = both.data() + ep * local;
    std::vector<int64_t> send(ep, 0), recv(ep, 0), per_expert(local, 0);
    for (int64_t j = 0; j < ep; ++j) {
      for (int64_t e = 0; e < local; ++e) {
        send[j] += counts[j * local + e];
        recv[j] += got[j * local + e];
        per_expert[e] += got[j * local + e];
      }
    }
    // 2. Dispatch: rows arrive grouped by source rank, then by local expert.
    const at::Tensor arrived = ExchangeRows::apply(x, &g, send, recv, stats_.get());
    // 3. Regroup by local expert (sources in rank order within each), run, and restore.
    std::vector<int64_t> source_start(ep * local, 0);
    for (int64_t j = 0, row = 0; j < ep; ++j) {
      for (int64_t e = 0; e < local; ++e) {
        source_start[j * local + e] = row;
        row += got[j * local + e];
      }
    }
    std::vector<int64_t> order;
    order.reserve(static_cast<size_t>(arrived.size(0)));
    for (int64_t e = 0; e < local; ++e) {
      for (int64_t j = 0; j < ep; ++j) {
        const int64_t start = source_start[j * local + e];
        for (int64_t r = 0; r < got[j * local + e]; ++r) order.push_back(start + r);
      }
    }
    const at::Tensor by_expert = at::tensor(order, at::kLong).to(x.device());
    const at::Tensor out = experts.forward(arrived.index_select(0, by_expert), per_expert);
    const at::Tensor back = at::empty_like(by_expert).scatter_(
        0, by_expert, at::arange(by_expert.numel(), by_expert.options()));
    const at::Tensor restored = out.index_select(0, back);
    // 4. Combine: every row back to the rank that routed it, in its order.
    return ExchangeRows::apply(restored, &g, recv, send, stats_.get());
  }

 private:
  std::shared_ptr<dist::Group> group_;
  std::shared_ptr<ExpertParallel::Stats> stats_;
};

}  // namespace

ExpertParallel::ExpertParallel(Model& model, std::shared_ptr<dist::Group> group,
                               const std::map<std::string, ParamPlacement>* tp_placements)
    : model_(model), group_(std::move(group)), stats_(std::make_shared<Stats>()) {
  TITAN_CHECK(group_ != nullptr, "expert parallelism needs its group");
  const int64_t ep = group_->size();
  const int64_t r = group_->rank();
  at::NoGradGuard no_grad;
  for (const auto& item : model.named_modules()) {
    auto* moe = dynamic_cast<MoE*>(item.value().get());
    if (moe == nullptr) continue;
    const int64_t n = moe->args().num_experts;
    if (n % ep != 0) {
      throw ConfigError(message("expert parallelism: MoE layer ", item.key(), " has ", n,
                                " experts, not divisible by expert_parallel_degree ", ep, " (", n,
                                " % ", ep, " = ", n % ep,
                                "). HINT: choose an ep that divides the number of experts"));
    }
    const int64_t local = n / ep;
    experts_per_rank_ = local;
    GroupedExperts& experts = *moe->experts;
    // The three weights and their LoRA adapters (w3 uses w1's A): every (experts, ...) tensor.
    std::vector<std::pair<std::string, WeightLayer*>> weights;
    for (const auto& [wname, layer] :
         {std::pair<const char*, ExpertWeight*>{"w1", experts.w1.get()},
          {"w2", experts.w2.get()},
          {"w3", experts.w3.get()}}) {
      weights.emplace_back(wname, layer);
      if (layer->lora_a && layer != experts.w3.get()) {
        weights.emplace_back(std::string(wname) + ".lora_a", layer->lora_a.get());
      }
      if (layer->lora_b) weights.emplace_back(std::string(wname) + ".lora_b", layer->lora_b.get());
    }
    if (experts.b1) {  // gpt-oss's expert biases, (experts, out)
      weights.emplace_back("b1", experts.b1.get());
      weights.emplace_back("b2", experts.b2.get());
      weights.emplace_back("b3", experts.b3.get());
    }
    for (const auto& [wname, layer] : weights) {
      at::Tensor& w = layer->weight;
      const std::string name = item.key() + ".experts." + wname + ".weight";
      ParamPlacement place{ShardBox::whole(w.sizes()), /*replicated=*/false};
      if (tp_placements != nullptr && tp_placements->count(name)) {
        place.box = tp_placements->at(name).box;  // hidden features already split over tp
      }
      place.box.offsets[0] = r * local;
      w.set_data(w.narrow(0, r * local, local).clone());
      placements_[name] = place;
    }
    moe->runner = std::make_shared<AllToAllExperts>(group_, stats_);
    ++layers_;
  }
  if (layers_ == 0) {
    throw ConfigError(
        message("parallelism.expert_parallel_degree = ", ep,
                " needs a mixture-of-experts model; this model has no MoE layer. HINT: set "
                "it to 1, or train an MoE flavor (e.g. qwen3 debugmodel_moe)"));
  }
}

ExpertParallel::~ExpertParallel() {
  for (const auto& item : model_.named_modules()) {
    if (auto* moe = dynamic_cast<MoE*>(item.value().get())) {
      moe->runner = std::make_shared<LocalExperts>();
    }
  }
}

at::Tensor ExpertParallel::gather_whole(const std::string& param, const at::Tensor& local) const {
  TITAN_CHECK(holds(param), "expert parallelism does not split ", param);
  const at::Tensor here = local.to(group_->device()).contiguous();
  std::vector<int64_t> shape = here.sizes().vec();
  shape[0] *= group_->size();
  at::Tensor out = at::empty(shape, here.options());
  group_->all_gather_into_tensor(out, here).wait();
  return out.to(local.device());
}

double ExpertParallel::comm_wait_seconds() const { return stats_->clock.seconds(); }

std::string ExpertParallel::describe() const {
  std::ostringstream os;
  os << "expert parallel over ep " << group_->size() << ": " << layers_ << " MoE layers, "
     << experts_per_rank_ << " experts per rank, tokens dispatched and combined by all-to-all";
  return os.str();
}

}  // namespace titan
