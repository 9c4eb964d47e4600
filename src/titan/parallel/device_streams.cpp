#include "titan/parallel/device_streams.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <chrono>

namespace titan {

namespace {

c10::Stream current_stream(const at::Device& device) {
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

// Events that time (BACKEND_DEFAULT) are only made for WaitClock; ordering events need none.
c10::Event ordering_event(const at::Device& device) {
  return c10::Event(device.type(), c10::EventFlag::PYTORCH_DEFAULT);
}

}  // namespace

SideStream::SideStream(const at::Device& device) : device_(device) {
  if (!device.is_cuda()) return;
  c10::impl::VirtualGuardImpl impl(device.type());
  stream_ = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/true);
}

std::shared_ptr<c10::Event> SideStream::run(const std::function<void()>& fn) {
  if (!stream_) {
    fn();
    return nullptr;
  }
  c10::Event ready = ordering_event(device_);
  ready.record(current_stream(device_));
  ready.block(*stream_);
  {
    c10::StreamGuard guard(*stream_);
    fn();
  }
  auto done = std::make_shared<c10::Event>(ordering_event(device_));
  done->record(*stream_);
  return done;
}

void SideStream::join(const std::shared_ptr<c10::Event>& done, WaitClock* clock) {
  if (!done) return;
  const c10::Stream current = current_stream(done->device());
  const auto wait = [&] { done->block(current); };
  if (clock != nullptr) {
    clock->time(wait);
  } else {
    wait();
  }
}

void SideStream::record_on(const at::Tensor& t) const {
  if (!stream_ || !t.defined() || !t.is_cuda()) return;
  c10::impl::VirtualGuardImpl(device_.type())
      .recordDataPtrOnStream(t.storage().data_ptr(), *stream_);
}

void SideStream::record_on_current(const at::Tensor& t) {
  if (!t.defined() || !t.is_cuda()) return;
  c10::impl::VirtualGuardImpl impl(t.device().type());
  impl.recordDataPtrOnStream(t.storage().data_ptr(), impl.getStream(t.device()));
}

void WaitClock::time(const std::function<void()>& wait) {
  if (!device_.is_cuda()) {
    const auto t0 = std::chrono::steady_clock::now();
    wait();
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return;
  }
  const c10::Stream stream = current_stream(device_);
  Pair pair{c10::Event(device_.type(), c10::EventFlag::BACKEND_DEFAULT),
            c10::Event(device_.type(), c10::EventFlag::BACKEND_DEFAULT)};
  pair.before.record(stream);
  wait();
  pair.after.record(stream);
  pending_.push_back(std::move(pair));
  resolve(/*block=*/false);  // keeps the queue short: most pairs finished long ago
}

void WaitClock::resolve(bool block) {
  while (!pending_.empty()) {
    Pair& p = pending_.front();
    if (!p.after.query()) {
      if (!block) return;
      p.after.synchronize();
    }
    seconds_ += p.before.elapsedTime(p.after) / 1e3;  // elapsedTime is in milliseconds
    pending_.pop_front();
  }
}

double WaitClock::seconds() {
  resolve(/*block=*/true);
  return seconds_;
}

}  // namespace titan
