// Fault-tolerant replica groups in the training loop ([fault_tolerance]; the protocol is in
// titan/distributed/ft/). This job is replica group fault_tolerance.replica_id of group_size:
// it reads its slice of the global data stream, and before each step joins the lighthouse's
// quorum; after backward its gradients (and loss) are averaged over the replica groups in the
// quorum, and the optimizer steps only when that worked on every rank of the group. A group that
// is behind (restarted, or one that missed a step) takes the whole training state from a peer
// over the network before the step: parameters, optimizer moments, the step, the tokens seen and
// the data loader's position, so that it goes on exactly where the others are.
#include "titan/trainer/trainer.h"

#include "titan/common/check.h"
#include "titan/common/logging.h"
#include "titan/components/data/data_loader.h"
#include "titan/distributed/ft/manager.h"
#include "titan/distributed/ft/semi_sync.h"
#include "titan/distributed/init.h"
#include "titan/distributed/parallel_dims.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>

namespace titan {

void Trainer::build_fault_tolerance() {
  const FaultToleranceSection& f = config_.fault_tolerance;
  if (!f.enable) return;
  TITAN_CONFIG_CHECK(parallel_->state_buffers().empty(),
                     "fault_tolerance.enable with MoE expert-bias load balancing (",
                     config_.model.name, " ", config_.model.flavor,
                     ") is not supported yet: the expert biases follow each replica group's own "
                     "token counts and would part ways. HINT: a dense model, or "
                     "load_balance_coeff = 0");
  ft::ManagerOptions o;
  o.replica_id = f.replica_id;
  o.lighthouse = ft::lighthouse_from_env();
  TITAN_CONFIG_CHECK(!o.lighthouse.empty(),
                     "fault_tolerance.enable needs the lighthouse's address in "
                     "TITAN_FT_LIGHTHOUSE=host:port (or TorchFT's TORCHFT_LIGHTHOUSE). HINT: start "
                     "`titan ft lighthouse --port 29510 --min_replicas ",
                     f.min_replica_size, "` and export TITAN_FT_LIGHTHOUSE=<its host>:29510");
  o.timeout = std::chrono::milliseconds(f.process_group_timeout_ms);
  o.quorum_timeout = std::chrono::seconds(config_.comm.train_timeout_seconds);
  // Rank r of every replica group holds the same shards: the layout and the model must agree.
  int64_t local_numel = 0;
  for (const TrainedParam& p : parallel_->params()) local_numel += p.local.numel();
  o.fingerprint = message(config_.model.name, " ", config_.model.flavor, ", ", dims_->describe(),
                          ", rank ", rank_, " holding ", local_numel, " parameters (",
                          config_.training.mixed_precision_param, ")");
  const auto [host, port] = ft::split_lighthouse_address(o.lighthouse);
  o.gloo_hostname = address_towards(host, port);
  ft_ = std::make_unique<ft::Manager>(o, world_.get());
  if (ft_outer_) ft_outer_->reset_snapshot();  // the parameters as resumed
  log_info("fault tolerance: ", ft_->describe(), " of ", f.group_size,
           " replica groups (lighthouse ", o.lighthouse, ", min_replica_size ", f.min_replica_size,
           ", process_group_timeout_ms ", f.process_group_timeout_ms, "); it trains rows [",
           f.replica_id * dp_size_ * config_.training.local_batch_size, ", ",
           (f.replica_id + 1) * dp_size_ * config_.training.local_batch_size,
           ") of each global batch of ", config_.training.local_batch_size * data_dp_size_,
           " sequences",
           f.semi_sync_method.empty()
               ? "; gradients averaged every step"
               : message("; ", f.semi_sync_method, ": a sync every ", f.sync_steps, " steps",
                         f.semi_sync_method == "diloco"
                             ? message(" (outer Nesterov SGD, lr ", f.outer_lr, ", momentum ",
                                       f.outer_momentum, ")")
                             : std::string()));
}

std::vector<at::Tensor> Trainer::ft_state_tensors() const {
  std::vector<at::Tensor> out;
  for (const TrainedParam& p : parallel_->params()) out.push_back(p.local);
  for (const auto& [name, t] : optimizer_->state_tensors()) out.push_back(t);
  for (const auto& [name, t] : parallel_->state_buffers()) out.push_back(t);
  if (ft_outer_) {
    for (const at::Tensor& t : ft_outer_->momentum_buffers()) out.push_back(t);
  }
  return out;
}

std::string Trainer::ft_state_blob() const {
  nlohmann::json j;
  j["step"] = train_state_.step;
  j["tokens_seen"] = train_state_.tokens_seen;
  j["optimizer_step_count"] = optimizer_->step_count();
  j["dataloader"] = train_loader_->state_json();
  return j.dump();
}

void Trainer::apply_ft_state_blob(const std::string& blob) {
  const nlohmann::json j = nlohmann::json::parse(blob, nullptr, /*allow_exceptions=*/false);
  TITAN_CHECK(j.is_object() && j.contains("step") && j.contains("dataloader"),
              "the state received from the source replica is malformed");
  train_state_.step = j.at("step").get<int64_t>();
  train_state_.tokens_seen = j.at("tokens_seen").get<int64_t>();
  optimizer_->set_step_count(j.at("optimizer_step_count").get<int64_t>());
  train_loader_->load_state_json(j.at("dataloader"));
}

void Trainer::log_ft_quorum() {
  const ft::Quorum& q = ft_->quorum();
  if (q.quorum_id == ft_quorum_id_) return;
  std::vector<int64_t> members, joined, left;
  for (const ft::Participant& p : q.participants) members.push_back(p.replica_id);
  for (int64_t id : members) {
    if (std::find(ft_members_.begin(), ft_members_.end(), id) == ft_members_.end())
      joined.push_back(id);
  }
  for (int64_t id : ft_members_) {
    if (std::find(members.begin(), members.end(), id) == members.end()) left.push_back(id);
  }
  const auto list = [](const std::vector<int64_t>& ids) {
    std::string out;
    for (int64_t id : ids) out += (out.empty() ? "" : ", ") + std::to_string(id);
    return out;
  };
  log_info("fault tolerance: quorum ", q.quorum_id, " before step ", train_state_.step + 1, ": ",
           q.describe(), "; ", members.size(), " of ", config_.fault_tolerance.group_size,
           " replica groups",
           ft_quorum_id_ >= 0 && !joined.empty() ? "; joined: " + list(joined) : std::string(),
           !left.empty() ? "; left: " + list(left) : std::string());
  ft_quorum_id_ = q.quorum_id;
  ft_members_ = members;
}

void Trainer::move_ft_state() {
  if (!ft_state_valid_ && !ft_->recovering()) {  // a recovery broke off; no one offers it again
    throw TrainingError(
        "fault tolerance: this replica's state was partly overwritten by a recovery that broke "
        "off, and no replica in the quorum (" +
        ft_->quorum().describe() +
        ") has a valid state to take. HINT: restart the replica groups from their last "
        "checkpoints");
  }
  if (!ft_->recovering() && !ft_->is_source()) return;
  const ft::Quorum& q = ft_->quorum();
  const int64_t source_id = q.participants[static_cast<size_t>(q.source_index())].replica_id;
  const auto t0 = std::chrono::steady_clock::now();
  std::string blob = ft_->is_source() ? ft_state_blob() : std::string();
  const bool recovering = ft_->recovering();
  if (recovering) ft_state_valid_ = false;  // until every tensor has arrived
  const bool moved = ft_->agree(ft_->transfer_state(ft_state_tensors(), blob));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!moved) {
    log_warning("fault tolerance: moving the state from replica ", source_id,
                " failed: ", ft_->error());
  } else if (recovering) {
    apply_ft_state_blob(blob);
    if (ft_outer_) ft_outer_->reset_snapshot();
    ft_state_valid_ = true;
    log_info("fault tolerance: took the state of replica ", source_id, " at step ",
             train_state_.step, " in ", seconds, " s (not from disk)");
  } else {
    log_info("fault tolerance: gave this replica's state at step ", train_state_.step,
             " to the replicas that recover, in ", seconds, " s");
  }
}

void Trainer::begin_ft_step() {
  const int64_t committed = ft_state_valid_ ? train_state_.step : -1;
  const bool built = ft_->start_step(committed);
  log_ft_quorum();
  if (!built) {
    log_warning("fault tolerance: ", ft_->error());
    return;  // the step will not commit; the next quorum rebuilds the group
  }
  move_ft_state();
}

void Trainer::ft_sync_round() {
  const int64_t committed = ft_state_valid_ ? train_state_.step : -1;
  const auto t0 = std::chrono::steady_clock::now();
  const bool built = ft_->start_step(committed);
  ft_joined_ = true;
  log_ft_quorum();
  if (!built) {
    log_warning("fault tolerance: ", ft_->error(), "; training on without a sync");
    return;
  }
  // The replicas that do not recover agree first; the others then take the agreed state.
  const bool contribute = !ft_->recovering();
  std::vector<at::Tensor> averaged = ft_outer_->to_average();
  const bool ok = ft_->agree(ft_->average(averaged, contribute, ft_->contributors()));
  if (ok && contribute) ft_outer_->apply(averaged);
  if (!ok) {
    log_warning(
        "fault tolerance: the sync after step ", train_state_.step,
        " failed (this replica keeps its own progress; the next sync includes it): ", ft_->error());
    return;
  }
  move_ft_state();
  log_info("fault tolerance: ", config_.fault_tolerance.semi_sync_method, " sync after step ",
           train_state_.step, " over ", ft_->contributors(), " replica group",
           ft_->contributors() > 1 ? "s" : "", " in ",
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), " s");
}

bool Trainer::ft_average(StepResult& result) {
  std::vector<at::Tensor> tensors;
  for (const TrainedParam& p : parallel_->params()) {
    if (p.frozen) continue;
    // Every replica group sends the same list: a parameter this batch did not reach has zeros.
    if (!p.local.grad().defined()) p.local.mutable_grad() = at::zeros_like(p.local);
    tensors.push_back(p.local.grad());
  }
  tensors.push_back(result.loss);
  for (auto& [name, value] : result.auxiliary) tensors.push_back(value);
  const bool ok = ft_->average(tensors);
  if (ft_->agree(ok)) return true;
  log_warning("fault tolerance: step ", train_state_.step + 1,
              " not committed (the optimizer did not step; it runs again with the next batch): ",
              ok ? "another rank of this replica group failed" : ft_->error());
  return false;
}

}  // namespace titan
