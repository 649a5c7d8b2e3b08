#include "loom/core/stream.hpp"

#include <vector>

#include "loom/config.hpp"
#include "loom/core/error.hpp"

#if LOOM_HAS_CUDA
#include "core/cuda/runtime.hpp"
#endif

namespace loom {
namespace {

// The current stream of each CUDA device for this thread; unset entries mean "default stream".
thread_local std::vector<Stream> current_streams;

void check_cuda_device(Device device) {
  LOOM_CHECK(device.index >= 0 && device.index < cuda_device_count(), "device ", device,
             " does not exist: this process sees ", cuda_device_count(), " CUDA device(s)",
             cuda_device_count() == 0 ? " (" + cuda_unavailable_reason() + ")" : std::string());
}

}  // namespace

Stream Stream::default_stream(Device device) {
  if (device.is_cpu()) return Stream();
  check_cuda_device(device);
  return Stream(device, nullptr, nullptr);
}

Stream Stream::create(Device device, bool high_priority) {
  if (device.is_cpu()) return Stream();
  check_cuda_device(device);
#if LOOM_HAS_CUDA
  void* handle = detail::cuda::stream_create(device.index, high_priority);
  std::shared_ptr<void> owner(handle, [](void* h) { detail::cuda::stream_destroy(h); });
  return Stream(device, handle, std::move(owner));
#else
  return Stream();
#endif
}

void Stream::synchronize() const {
#if LOOM_HAS_CUDA
  if (device_.is_cuda()) {
    DeviceGuard guard(device_);
    detail::cuda::stream_synchronize(handle_);
  }
#endif
}

bool Stream::query() const {
#if LOOM_HAS_CUDA
  if (device_.is_cuda()) {
    DeviceGuard guard(device_);
    return detail::cuda::stream_query(handle_);
  }
#endif
  return true;
}

void Stream::wait(const Event& event) const {
  if (device_.is_cpu() || !event.recorded()) return;
  if (event.device().is_cpu()) return;  // host events are complete when recorded
#if LOOM_HAS_CUDA
  DeviceGuard guard(device_);
  detail::cuda::stream_wait_event(handle_, event.native_handle());
#endif
}

Stream current_stream(Device device) {
  if (device.is_cpu()) return Stream();
  check_cuda_device(device);
  const auto index = static_cast<size_t>(device.index);
  if (index < current_streams.size() && current_streams[index].device() == device) {
    return current_streams[index];
  }
  return Stream::default_stream(device);
}

Stream current_stream() {
  return current_stream(current_device());
}

StreamGuard::StreamGuard(const Stream& stream) : previous_(current_stream(stream.device())) {
  if (stream.device().is_cpu()) return;
  const auto index = static_cast<size_t>(stream.device().index);
  if (current_streams.size() <= index) current_streams.resize(index + 1);
  current_streams[index] = stream;
}

StreamGuard::~StreamGuard() {
  if (previous_.device().is_cpu()) return;
  current_streams[static_cast<size_t>(previous_.device().index)] = previous_;
}

// ---- Event -------------------------------------------------------------------------------------

Event::Event(bool enable_timing) : enable_timing_(enable_timing) {}

Event::~Event() {
  release();
}

Event::Event(Event&& other) noexcept {
  *this = std::move(other);
}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    release();
    enable_timing_ = other.enable_timing_;
    recorded_ = other.recorded_;
    device_ = other.device_;
    handle_ = other.handle_;
    host_time_ = other.host_time_;
    other.handle_ = nullptr;
    other.recorded_ = false;
  }
  return *this;
}

void Event::release() noexcept {
#if LOOM_HAS_CUDA
  if (handle_) detail::cuda::event_destroy(handle_);
#endif
  handle_ = nullptr;
}

void Event::record(const Stream& stream) {
  if (stream.device().is_cpu()) {
    release();
    device_ = Device::cpu();
    host_time_ = std::chrono::steady_clock::now();
    recorded_ = true;
    return;
  }
#if LOOM_HAS_CUDA
  if (handle_ && device_ != stream.device()) release();
  device_ = stream.device();
  if (!handle_) handle_ = detail::cuda::event_create(device_.index, enable_timing_);
  DeviceGuard guard(device_);
  detail::cuda::event_record(handle_, stream.native_handle());
  recorded_ = true;
#endif
}

void Event::synchronize() const {
#if LOOM_HAS_CUDA
  if (recorded_ && handle_) detail::cuda::event_synchronize(handle_);
#endif
}

bool Event::query() const {
#if LOOM_HAS_CUDA
  if (recorded_ && handle_) return detail::cuda::event_query(handle_);
#endif
  return true;
}

double Event::elapsed_ms(const Event& end) const {
  LOOM_CHECK(recorded_ && end.recorded_, "Event::elapsed_ms: both events must be recorded");
  LOOM_CHECK(device_ == end.device_, "Event::elapsed_ms: events were recorded on ", device_,
             " and ", end.device_, "; they must be on the same device");
  if (device_.is_cpu()) {
    return std::chrono::duration<double, std::milli>(end.host_time_ - host_time_).count();
  }
  LOOM_CHECK(enable_timing_ && end.enable_timing_,
             "Event::elapsed_ms: CUDA events need enable_timing=true");
#if LOOM_HAS_CUDA
  return detail::cuda::event_elapsed_ms(handle_, end.handle_);
#else
  return 0.0;
#endif
}

}  // namespace loom
