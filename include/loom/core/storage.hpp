// A reference-counted block of memory on one device.
//
// Tensors share a Storage through std::shared_ptr and look at it through an
// offset, so views (slices, flat views into a gradient bucket) keep the whole
// block alive. Memory comes from the device's allocator, or is wrapped from
// elsewhere (a memory-mapped file) with a release callback.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "loom/core/device.hpp"
#include "loom/core/stream.hpp"

namespace loom {

class Allocator;

class Storage {
 public:
  // `nbytes` from allocator_for(device), usable in order on `stream`.
  static std::shared_ptr<Storage> allocate(size_t nbytes, Device device, const Stream& stream);
  // Memory owned elsewhere; `release` (may be empty) runs when the Storage is destroyed.
  static std::shared_ptr<Storage> wrap(void* data, size_t nbytes, Device device,
                                       std::function<void()> release);

  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  // The stream the memory was allocated on.
  const Stream& stream() const { return stream_; }
  // See Allocator::record_stream(). A no-op for wrapped memory and the host.
  void record_stream(const Stream& stream);

 private:
  Storage() = default;

  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_ = Device::cpu();
  Stream stream_;
  Allocator* allocator_ = nullptr;  // null for wrapped memory
  std::function<void()> release_;
};

}  // namespace loom
