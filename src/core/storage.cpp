#include "loom/core/storage.hpp"

#include "loom/core/allocator.hpp"

namespace loom {

std::shared_ptr<Storage> Storage::allocate(size_t nbytes, Device device, const Stream& stream) {
  Allocator& allocator = allocator_for(device);
  std::shared_ptr<Storage> storage(new Storage());
  storage->data_ = allocator.allocate(nbytes, stream);
  storage->nbytes_ = nbytes;
  storage->device_ = device;
  storage->stream_ = stream;
  storage->allocator_ = &allocator;
  return storage;
}

std::shared_ptr<Storage> Storage::wrap(void* data, size_t nbytes, Device device,
                                       std::function<void()> release) {
  std::shared_ptr<Storage> storage(new Storage());
  storage->data_ = data;
  storage->nbytes_ = nbytes;
  storage->device_ = device;
  storage->release_ = std::move(release);
  return storage;
}

Storage::~Storage() {
  if (allocator_) {
    allocator_->deallocate(data_);
  } else if (release_) {
    release_();
  }
}

void Storage::record_stream(const Stream& stream) {
  if (allocator_ && data_ && !(stream == stream_)) allocator_->record_stream(data_, stream);
}

}  // namespace loom
