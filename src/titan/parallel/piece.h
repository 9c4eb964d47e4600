// One parallelism as applied to one model part (the whole model, or one pipeline stage): what a
// ParallelizedModel asks of every piece, whatever it is. A part holds its pieces in the order
// parallelize applied them (tensor, expert and context parallelism, activation checkpointing,
// FSDP / HSDP / DDP), and every question below is asked of each in turn, so a new parallelism is
// a new class here, not a new branch in the parallelized model.
//
//   for (auto& piece : part.pieces) piece->finish_backward();
//
// Every method has a default that means "this piece has nothing to do with it".
#pragma once

#include "titan/common/shard_box.h"
#include "titan/distributed/comm.h"
#include "titan/models/model.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace titan {

// Where a rank's tensor of a parameter sits in the whole parameter (set by tensor parallelism;
// absent: the rank holds the whole parameter).
struct ParamPlacement {
  ShardBox box;            // of the rank's tensor in the whole parameter
  bool replicated = true;  // every rank of the (tp) group holds the same tensor
};

// This rank's part of one parameter, when a piece (FSDP) keeps it apart from the model's tensor.
struct ShardedParam {
  std::string name;
  ShardBox box;            // where `local` sits in the whole parameter
  int64_t row_offset = 0;  // first row held of the model's (possibly TP-local) tensor
  at::Tensor local;        // (rows held, ...) float32, a view of the unit's flat shard; 0 rows ok
};

// Bytes per rank (float32 masters), for the memory report.
struct DataParallelMemory {
  int64_t total_param_bytes = 0;         // the whole model's parameters
  int64_t shard_param_bytes = 0;         // this rank's shards, including padding
  int64_t max_unit_unsharded_bytes = 0;  // the largest unit when gathered (param dtype + float8)
  int64_t units = 0;
};

// A training batch on its way to the model: the tokens, their labels and the rest of the
// forward's inputs. A piece that splits the batch (context parallelism) replaces them by this
// rank's share.
struct ForwardBatch {
  at::Tensor inputs;  // (bs, seqlen) int64
  at::Tensor labels;  // (bs, seqlen) int64
  ForwardInputs forward;
};

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

class ParallelPiece {
 public:
  virtual ~ParallelPiece() = default;

  // A line for the log ("" for none).
  virtual std::string describe() const = 0;
  // Whether any collective runs during a step.
  virtual bool communicates() const { return true; }
  // Seconds this rank has spent blocked in this piece's collectives since construction.
  virtual double comm_wait_seconds() const { return 0.0; }

  // Where this rank's tensor of each parameter the piece splits sits in the whole parameter.
  // A later piece's entry replaces an earlier one's (expert parallelism's boxes carry tensor
  // parallelism's split of the experts).
  virtual const std::map<std::string, ParamPlacement>* param_placements() const { return nullptr; }
  // The tensors the optimizer trains in place of the model's parameters (FSDP's shards), or null.
  virtual const std::vector<ShardedParam>* shards() const { return nullptr; }

  // This rank's share of the batch (default: all of it).
  virtual void shard_batch(ForwardBatch& batch) const {}
  // Whether the model's logits leave this piece split (tensor parallelism's vocabulary shards),
  // and then the mean next-token loss computed on them (lm_cross_entropy_loss otherwise).
  virtual bool splits_logits() const { return false; }
  virtual at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& labels) const {
    return {};
  }

  virtual void zero_grad() {}
  // Completes the gradients of the last backward (FSDP's reductions).
  virtual void finish_backward() {}
  // Completes the gradients that are partial over this piece's group (tensor parallelism's
  // replicated parameters): `grads` are (name, gradient) of the parameters whose placement is
  // this piece's. Collective over the group.
  virtual void reduce_partial_grads(const NamedTensors& grads) {}
  // The group over whose ranks the gradient norm's squares are summed because they hold
  // different pieces of the gradients (null: none beyond the other pieces'). The groups of all
  // pieces (and the pipeline's) together span each gradient element once.
  virtual dist::Group* norm_group() const { return nullptr; }

  // Whole parameters for export, in two passes over the pieces (collective):
  //   held: the pieces that keep the trained tensors (FSDP) put the parameters as the model holds
  //         them (whole, or a TP box) into `held`;
  //   whole: in reverse apply order, each piece undoes its split of the entries of `params`.
  virtual void gather_held(std::map<std::string, at::Tensor>& held) {}
  virtual void gather_whole(NamedTensors& params) const {}
  // Sets the tensors this piece keeps (shards()) from whole parameters: whole(name) is the
  // (global shape) tensor.
  virtual void load_whole(const std::function<at::Tensor(const std::string&)>& whole) {}

  // FSDP's memory per rank (zeros for the other pieces).
  virtual DataParallelMemory memory() const { return {}; }

  // The model stopped registering some parameters (QLoRA holds frozen weights in NF4 instead):
  // a piece that keeps per-parameter state drops theirs.
  virtual void parameters_removed() {}
};

}  // namespace titan
