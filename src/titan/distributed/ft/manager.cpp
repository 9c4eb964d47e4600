// The replica group's side of fault tolerance (see manager.h): the lighthouse's protocol keys are
// in lighthouse.h.
#include "titan/distributed/ft/manager.h"

#include "titan/common/check.h"
#include "titan/common/logging.h"
#include "titan/distributed/ft/lighthouse.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>

namespace titan::ft {

namespace {

std::vector<uint8_t> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }

// The tensors of one dtype, flattened into one buffer in order (one message or op per dtype).
struct Flat {
  at::ScalarType dtype;
  std::vector<at::Tensor> parts;
  at::Tensor buffer;
};

std::vector<Flat> flatten_by_dtype(const std::vector<at::Tensor>& tensors) {
  std::vector<Flat> out;
  for (const at::Tensor& t : tensors) {
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const Flat& f) { return f.dtype == t.scalar_type(); });
    if (it == out.end()) {
      out.push_back({t.scalar_type(), {}, {}});
      it = out.end() - 1;
    }
    it->parts.push_back(t);
  }
  for (Flat& f : out) {
    std::vector<at::Tensor> views;
    for (const at::Tensor& t : f.parts) views.push_back(t.detach().reshape({-1}));
    f.buffer = at::cat(views);
  }
  return out;
}

void unflatten(const Flat& f) {
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const at::Tensor& t : f.parts) {
    const int64_t n = t.numel();
    t.copy_(f.buffer.narrow(0, offset, n).view(t.sizes()));
    offset += n;
  }
}

}  // namespace

std::pair<std::string, int> split_lighthouse_address(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    throw QuorumError("the lighthouse address '" + address +
                      "' is not host:port. HINT: TITAN_FT_LIGHTHOUSE=10.0.0.1:29510");
  }
  const std::string port = address.substr(colon + 1);
  char* end = nullptr;
  const long value = std::strtol(port.c_str(), &end, 10);
  if (*end != '\0' || value <= 0 || value > 65535) {
    throw QuorumError("the lighthouse address '" + address + "' has no valid port");
  }
  return {address.substr(0, colon), static_cast<int>(value)};
}

// Rank 0's beat: a store key counted up from a thread of its own, on its own connection.
struct Manager::Heartbeat {
  c10::intrusive_ptr<c10d::Store> store;
  std::string key;
  std::chrono::milliseconds interval;
  std::atomic<bool> stopping{false};
  std::mutex mu;
  std::condition_variable wake;
  std::thread thread;

  void run() {
    bool warned = false;
    std::unique_lock<std::mutex> lock(mu);
    while (!stopping) {
      lock.unlock();
      try {
        store->add(key, 1);
        warned = false;
      } catch (const std::exception& e) {
        if (!warned) log_warning("fault tolerance: heartbeat to the lighthouse failed: ", e.what());
        warned = true;
      }
      lock.lock();
      wake.wait_for(lock, interval, [this] { return stopping.load(); });
    }
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    wake.notify_all();
    if (thread.joinable()) thread.join();
  }
};

std::string lighthouse_from_env() {
  for (const char* name : {"TITAN_FT_LIGHTHOUSE", "TORCHFT_LIGHTHOUSE"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    std::string address = value;
    for (const char* scheme : {"http://", "https://"}) {
      if (address.rfind(scheme, 0) == 0) address = address.substr(std::string(scheme).size());
    }
    while (!address.empty() && address.back() == '/') address.pop_back();
    return address;
  }
  return "";
}

Manager::Manager(ManagerOptions options, dist::Group* group)
    : options_(std::move(options)), group_(group) {
  // Gloo writes with writev, which raises SIGPIPE when the peer is gone: a replica group that
  // dies mid-transfer must be an error here (the step does not commit), not end this one too.
  signal(SIGPIPE, SIG_IGN);
  rank_ = group_ != nullptr ? group_->rank() : 0;
  const auto [host, port] = split_lighthouse_address(options_.lighthouse);
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(port);
  opts.isServer = false;
  opts.waitWorkers = false;
  opts.timeout = options_.quorum_timeout;
  try {
    store_ = c10::make_intrusive<c10d::TCPStore>(host, opts);
  } catch (const std::exception& e) {
    throw QuorumError("cannot reach the lighthouse at " + options_.lighthouse + ": " +
                      error_text(e) + ". HINT: start it with `titan ft lighthouse --port " +
                      std::to_string(port) + "` and check TITAN_FT_LIGHTHOUSE");
  }
  if (rank_ == 0) {
    std::random_device device;
    incarnation_ =
        static_cast<int64_t>((static_cast<uint64_t>(device()) << 20) ^ device()) & 0x7fffffffffffLL;
  }
  if (group_ != nullptr && group_->size() > 1)
    incarnation_ = group_->broadcast_int(incarnation_, 0);
  key_ = std::to_string(options_.replica_id) + ":" + std::to_string(incarnation_);
  if (rank_ == 0) {
    store_->add(ft_keys::beat(key_), 1);  // beating before registering: never seen silent
    store_->append(ft_keys::kReplicas, bytes_of(key_ + ";"));
    heartbeat_ = std::make_unique<Heartbeat>();
    heartbeat_->store = store_->clone();
    heartbeat_->key = ft_keys::beat(key_);
    heartbeat_->interval = options_.beat_interval;
    heartbeat_->thread = std::thread([hb = heartbeat_.get()] { hb->run(); });
  }
}

Manager::~Manager() {
  replicas_.reset();
  if (heartbeat_) heartbeat_->stop();
  if (rank_ == 0) {
    try {
      store_->set(ft_keys::left(key_), bytes_of("1"));
    } catch (const std::exception&) {  // the lighthouse is gone: it will not wait for us either
    }
  }
}

std::string Manager::describe() const {
  return "replica " + std::to_string(options_.replica_id) + " (incarnation " +
         std::to_string(incarnation_) + ")";
}

bool Manager::fail(const std::string& what, const std::exception& e) {
  error_ = what + ": " + error_text(e);
  return false;
}

bool Manager::start_step(int64_t committed) {
  std::string text;
  if (rank_ == 0) {
    ++seq_;
    store_->set(ft_keys::request(key_),
                bytes_of(std::to_string(seq_) + " " + std::to_string(committed) + " " +
                         (fresh_ ? "1" : "0") + " " + (group_broken_ ? "1" : "0")));
    const std::string key = ft_keys::answer(key_, seq_);
    try {
      store_->wait({key}, options_.quorum_timeout);
      const std::vector<uint8_t> bytes = store_->get(key);
      text.assign(bytes.begin(), bytes.end());
      store_->deleteKey(key);
    } catch (const std::exception& e) {
      throw QuorumError(
          describe() + " got no quorum from the lighthouse at " + options_.lighthouse + " within " +
          std::to_string(options_.quorum_timeout.count() / 1000) + " s: " + error_text(e) +
          ". HINT: fewer than fault_tolerance.min_replica_size replica groups are "
          "running, or the lighthouse is down (its log says which)");
    }
  }
  if (group_ != nullptr && group_->size() > 1) text = group_->broadcast_string(text, 0);
  quorum_ = Quorum::from_json(text);
  fresh_ = false;
  const int me = quorum_.index_of(options_.replica_id);
  TORCH_CHECK(me >= 0, describe(), " is not in the quorum it was given: ", quorum_.describe());
  if (quorum_.quorum_id == group_quorum_id_ && !group_broken_) return true;
  replicas_.reset();  // a broken group's peers are gone or rebuilding
  group_broken_ = false;
  group_quorum_id_ = quorum_.quorum_id;
  if (participants() == 1) return true;
  dist::GroupOptions o;
  o.name = "ft_replicas";
  o.timeout = options_.timeout;
  o.fingerprint = options_.fingerprint;
  o.gloo_hostname = options_.gloo_hostname;
  o.stage_cuda_tensors = true;  // GPU ranks: their CUDA tensors through host memory
  try {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(
        ft_keys::process_group(quorum_.quorum_id, rank_), store_);
    replicas_ = dist::Group::create(prefixed, me, static_cast<int>(participants()), o);
  } catch (const std::exception& e) {
    group_broken_ = true;
    return fail("building the cross-replica group of quorum " + std::to_string(quorum_.quorum_id) +
                    " (" + quorum_.describe() + ")",
                e);
  }
  return true;
}

bool Manager::recovering() const {
  const int me = quorum_.index_of(options_.replica_id);
  return me >= 0 && quorum_.recovers(me);
}

bool Manager::is_source() const {
  const int me = quorum_.index_of(options_.replica_id);
  if (me < 0 || me != quorum_.source_index()) return false;
  for (int i = 0; i < static_cast<int>(quorum_.participants.size()); ++i) {
    if (quorum_.recovers(i)) return true;
  }
  return false;
}

bool Manager::transfer_state(const std::vector<at::Tensor>& tensors, std::string& blob) {
  const bool source = is_source(), receiver = recovering();
  if (!source && !receiver) return true;
  if (!replicas_) {
    error_ = "no cross-replica group to move the state over";
    return false;
  }
  try {
    std::vector<Flat> flats = flatten_by_dtype(tensors);
    const int src = quorum_.source_index();
    if (source) {
      const at::Tensor length = at::tensor({static_cast<int64_t>(blob.size())}, at::kLong);
      const at::Tensor bytes = at::empty({static_cast<int64_t>(blob.size())}, at::kByte);
      std::memcpy(bytes.data_ptr(), blob.data(), blob.size());
      for (int i = 0; i < static_cast<int>(quorum_.participants.size()); ++i) {
        if (!quorum_.recovers(i)) continue;
        std::vector<dist::Work> works;
        works.push_back(replicas_->send(length, i, /*tag=*/0));
        if (bytes.numel() > 0) works.push_back(replicas_->send(bytes, i, /*tag=*/1));
        for (size_t k = 0; k < flats.size(); ++k) {
          works.push_back(replicas_->send(flats[k].buffer, i, /*tag=*/static_cast<int>(2 + k)));
        }
        for (dist::Work& w : works) w.wait();
      }
      return true;
    }
    const at::Tensor length = at::empty({1}, at::kLong);
    replicas_->recv(length, src, /*tag=*/0).wait();
    const int64_t n = length.item<int64_t>();
    TORCH_CHECK(n >= 0 && n < (int64_t{1} << 32), "the source's state has a length of ", n);
    const at::Tensor bytes = at::empty({n}, at::kByte);
    if (n > 0) replicas_->recv(bytes, src, /*tag=*/1).wait();
    for (size_t k = 0; k < flats.size(); ++k) {
      replicas_->recv(flats[k].buffer, src, /*tag=*/static_cast<int>(2 + k)).wait();
    }
    for (const Flat& f : flats) unflatten(f);
    blob.assign(reinterpret_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(n));
    return true;
  } catch (const std::exception& e) {
    group_broken_ = true;
    return fail(std::string(source ? "sending" : "receiving") + " the state of replica " +
                    std::to_string(quorum_.participants[quorum_.source_index()].replica_id),
                e);
  }
}

int64_t Manager::contributors() const {
  int64_t n = 0;
  for (int i = 0; i < static_cast<int>(quorum_.participants.size()); ++i) n += !quorum_.recovers(i);
  return n;
}

bool Manager::average(const std::vector<at::Tensor>& tensors, bool contribute,
                      int64_t contributors) {
  const int64_t divisor = contributors < 0 ? participants() : contributors;
  if (participants() == 1) return true;
  if (!replicas_) {
    error_ = "no cross-replica group (building it failed)";
    return false;
  }
  try {
    std::vector<Flat> flats = flatten_by_dtype(tensors);
    std::vector<dist::Work> works;
    for (Flat& f : flats) {
      if (!contribute) f.buffer.zero_();
      works.push_back(replicas_->all_reduce(f.buffer, dist::ReduceOp::kSum));
    }
    for (dist::Work& w : works) w.wait();
    if (!contribute) return true;
    for (Flat& f : flats) {
      f.buffer.div_(static_cast<double>(divisor));
      unflatten(f);
    }
    return true;
  } catch (const std::exception& e) {
    group_broken_ = true;
    return fail("averaging over quorum " + std::to_string(quorum_.quorum_id) + " (" +
                    quorum_.describe() + ")",
                e);
  }
}

bool Manager::agree(bool ok) {
  bool all = ok;
  if (group_ != nullptr && group_->size() > 1) {
    const at::Tensor flag = at::tensor({ok ? 1.0f : 0.0f}).to(group_->device());
    group_->all_reduce(flag, dist::ReduceOp::kMin).wait();
    all = flag.cpu().item<float>() > 0.5f;
  }
  if (!all) group_broken_ = true;
  return all;
}

}  // namespace titan::ft
