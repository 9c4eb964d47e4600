// Whole parameters of every pipeline stage on every rank (see stage_gather.h).
#include "titan/checkpoint/stage_gather.h"

#include "titan/common/check.h"

#include <sstream>

namespace titan::ckpt {

std::vector<std::pair<std::string, at::Tensor>> gather_stages(
    const std::vector<StageTensors>& mine, const std::vector<int64_t>& stage_rank,
    dist::Group* pp) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (pp == nullptr) {
    for (const StageTensors& s : mine) out.insert(out.end(), s.tensors.begin(), s.tensors.end());
    return out;
  }
  const at::Device wire = pp->device();
  for (int64_t stage = 0; stage < static_cast<int64_t>(stage_rank.size()); ++stage) {
    const int root = static_cast<int>(stage_rank[stage]);
    const StageTensors* held = nullptr;
    for (const StageTensors& s : mine) {
      if (s.stage == stage) held = &s;
    }
    TITAN_CHECK((held != nullptr) == (root == pp->rank()), "gather_stages: stage ", stage,
                " runs on pp rank ", root, ", but pp rank ", pp->rank(),
                held != nullptr ? " holds it" : " does not hold it");
    // One line per tensor: its name, then its shape.
    std::string text;
    if (held != nullptr) {
      std::ostringstream os;
      for (const auto& [name, t] : held->tensors) {
        os << name;
        for (int64_t d : t.sizes()) os << ' ' << d;
        os << '\n';
      }
      text = os.str();
    }
    std::istringstream lines(pp->broadcast_string(text, root));
    std::string line;
    size_t k = 0;
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      std::string name;
      fields >> name;
      std::vector<int64_t> shape;
      for (int64_t d; fields >> d;) shape.push_back(d);
      at::Tensor t = held != nullptr ? held->tensors[k].second.to(wire, at::kFloat)
                                     : at::empty(shape, at::TensorOptions(at::kFloat).device(wire));
      pp->broadcast(t, root).wait();
      out.emplace_back(name, t.to(at::kCPU));
      ++k;
    }
  }
  return out;
}

}  // namespace titan::ckpt
