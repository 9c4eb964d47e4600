// Side streams for collectives, and the accounting of how long compute waits for them. Written on
// c10's device-generic Stream and Event, so it compiles in any build and is a no-op on the CPU:
//
//   SideStream gather(device);                    // CUDA: a high-priority stream from the pool
//   auto done = gather.run([&] { issue + wait });  // runs after the current stream's queued work
//   ...compute on the current stream overlaps it...
//   gather.join(done, &clock);                     // the current stream waits for `done`
//
// On the CPU (Gloo), run() calls fn inline and returns no event: Gloo's wait() blocks the host,
// so the host time around it is the wait. On CUDA, NCCL's wait() only makes a stream wait, so
// host time says nothing; WaitClock instead records an event on the compute stream just before it
// starts waiting and one just after, and the time between them on the device is the time compute
// stood still for communication.
//
// Memory across streams: the caching allocator ties a block to the stream that allocated it and
// may hand it out again, on that stream, as soon as the host frees it. A tensor allocated on one
// stream and still read or written by another must be recorded on that other stream
// (record_on / record_on_current) so that its block waits for the other stream's work too.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <deque>
#include <functional>
#include <memory>
#include <optional>

namespace titan {

class WaitClock;

class SideStream {
 public:
  // A stream of its own on a CUDA `device`; none (everything inline) elsewhere.
  explicit SideStream(const at::Device& device);
  bool active() const { return stream_.has_value(); }

  // Runs fn with this stream current, after it has waited for everything queued on the current
  // stream so far (fn's inputs). Returns an event marking the end of what fn queued (null on the
  // CPU, where fn has finished when run returns).
  std::shared_ptr<c10::Event> run(const std::function<void()>& fn);
  // The current stream waits for `done` (a no-op for null); the stall goes to `clock`.
  static void join(const std::shared_ptr<c10::Event>& done, WaitClock* clock);
  // `t`'s memory stays reserved until this stream's work queued so far is done.
  void record_on(const at::Tensor& t) const;
  // The same for the current stream (a block allocated on a side stream, used by compute).
  static void record_on_current(const at::Tensor& t);

 private:
  at::Device device_;
  std::optional<c10::Stream> stream_;
};

class WaitClock {
 public:
  explicit WaitClock(const at::Device& device) : device_(device) {}
  // Runs `wait`, which makes the host (CPU) or the current stream (CUDA) wait, and adds the time
  // that waiting takes.
  void time(const std::function<void()>& wait);
  // Seconds waited so far. On CUDA it resolves the recorded event pairs, waiting for the newest.
  double seconds();

 private:
  struct Pair {
    c10::Event before, after;
  };
  void resolve(bool block);

  at::Device device_;
  double seconds_ = 0;
  std::deque<Pair> pending_;  // CUDA: recorded, not yet resolved
};

}  // namespace titan
