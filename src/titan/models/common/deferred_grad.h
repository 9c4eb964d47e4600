// Deferred weight gradients: the zero-bubble split of a backward into the gradient of its input
// (I) and the gradients of its weights (W), as the pipeline runtime runs it (pipeline.h).
//
// A layer that can defer (Linear, and float8 Linear) holds a WeightGradDeferral shared with the
// rest of its pipeline stage. While the runtime has a DeferredGrads installed there (its I
// backward), the layer's backward computes only grad_input = grad_output @ W and adds the weight
// GEMM grad_output^T @ x, with the two operands it needs, to the DeferredGrads; autograd then
// carries no gradient to the weight. A data parallelism whose backward reduces the weights'
// gradients (FSDP's unit reduction) adds itself as a consumer of those weights instead of
// reducing right away. W (DeferredGrads::run) computes the GEMMs in the order the backward met
// them and hands each consumer its weights' gradients as soon as they are all computed; weights
// no consumer takes get the gradient added to their parameter's .grad, as autograd would.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <vector>

namespace titan {

class WeightLayer;

// What one I backward left for its W (see the top of this file).
class DeferredGrads {
 public:
  // `compute` returns the gradient of the weight that `layer` reads through its `weight` member,
  // in the dtype the layer's matmul ran in. Several for one layer (a layer run twice) are summed.
  void add_weight_grad(WeightLayer* layer, std::function<at::Tensor()> compute);
  // `take` receives the gradients of the weights read through `slots` (WeightLayer::weight
  // members; undefined where none was deferred) once every weight gradient added before this
  // call is computed.
  using Consumer = std::function<void(std::vector<at::Tensor>)>;
  void add_consumer(std::vector<const at::Tensor*> slots, Consumer take);
  // W: computes the gradients and delivers them (see the top of this file). Runs once.
  void run();
  // Weight GEMMs waiting.
  int64_t pending() const { return pending_; }

 private:
  struct Event {
    WeightLayer* layer = nullptr;  // a weight GEMM, or (null) a consumer
    std::function<at::Tensor()> compute;
    std::vector<const at::Tensor*> slots;
    Consumer take;
  };
  std::vector<Event> events_;
  int64_t pending_ = 0;
};

// Shared by the layers of one model (a pipeline stage) and its data parallelism: where their
// backward sends weight gradients while an I backward runs.
class WeightGradDeferral {
 public:
  // The DeferredGrads collecting now, or null (weight gradients flow through autograd).
  DeferredGrads* current() const { return current_; }

  // Installs `into` for the scope's lifetime.
  class Scope {
   public:
    Scope(WeightGradDeferral& deferral, DeferredGrads* into)
        : deferral_(deferral), previous_(deferral.current_) {
      deferral.current_ = into;
    }
    ~Scope() { deferral_.current_ = previous_; }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    WeightGradDeferral& deferral_;
    DeferredGrads* previous_;
  };

 private:
  DeferredGrads* current_ = nullptr;
};

// A layer's view of its deferral: where its weight gradient goes when one is collecting.
struct DeferTarget {
  const WeightGradDeferral* deferral = nullptr;
  WeightLayer* layer = nullptr;
  DeferredGrads* current() const { return deferral != nullptr ? deferral->current() : nullptr; }
};

}  // namespace titan
