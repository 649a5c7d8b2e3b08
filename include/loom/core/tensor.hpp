// Tensor: a typed, shaped, contiguous row-major view of a Storage.
//
// A Tensor is a cheap handle: copying it shares the storage (reference
// counted), it does not copy elements. Views (view, slice, select, flat_view)
// share storage too and keep all of it alive; gradient buckets and ZeRO
// shards are flat views into one large buffer. Every tensor is contiguous:
// element (i0, .., ik) lives at row-major position within [data(), data() +
// nbytes()).
//
// Work on CUDA tensors is queued on the current stream of their device (see
// stream.hpp) and is asynchronous, except where a function says it returns
// host data (to_vector, item): those synchronise that stream.
//
// Errors (shape or dtype mismatch, out-of-range slice) throw loom::Error with
// the shapes and the rule in the message.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "loom/core/device.hpp"
#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"
#include "loom/core/storage.hpp"

namespace loom {

using Shape = std::vector<int64_t>;

// Product of the dimensions (1 for a scalar shape {}); throws on a negative dimension.
int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[2, 3]"

class Tensor {
 public:
  // An undefined tensor (defined() is false).
  Tensor() = default;

  // Uninitialised memory from the device's allocator, on its current stream.
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
                     Device device = Device::cpu());
  // A tensor of dtype_of<T>() holding a copy of `values`.
  template <typename T>
  static Tensor from_vector(std::span<const T> values, const Shape& shape,
                            Device device = Device::cpu());
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                            Device device = Device::cpu()) {
    return from_vector(std::span<const T>(values), shape, device);
  }
  // Wraps memory owned elsewhere (e.g. a memory-mapped file). `release` runs
  // when the last tensor viewing it goes away.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device,
                          std::function<void()> release = {});

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  // Size of dimension d; negative d counts from the end.
  int64_t size(int64_t d) const;
  int64_t numel() const { return numel_; }
  size_t element_size() const { return dtype_size(dtype_); }
  size_t nbytes() const { return static_cast<size_t>(numel_) * element_size(); }
  DType dtype() const { return dtype_; }
  Device device() const;

  // Address of the first element (device memory for CUDA tensors).
  void* data() const;
  // Typed address; throws if T is not the tensor's dtype.
  template <typename T>
  T* data() const {
    check_dtype(dtype_of<T>(), "data<T>()");
    return static_cast<T*>(data());
  }
  // Offset of the first element within the storage, in bytes.
  size_t storage_offset() const { return offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool shares_storage(const Tensor& other) const { return defined() && storage_ == other.storage_; }
  // No other handle (tensor or view) shares this one's storage: what is
  // written into it can be seen nowhere else.
  bool sole_handle() const { return defined() && storage_.use_count() == 1; }

  // ---- views: share the storage -------------------------------------------------------------
  // Same elements, new shape (one dimension may be -1 and is inferred).
  Tensor view(const Shape& shape) const;
  Tensor flatten() const { return view({numel_}); }
  // Rows [begin, end) along dimension 0.
  Tensor slice(int64_t begin, int64_t end) const;
  // Row `index` along dimension 0, with that dimension removed.
  Tensor select(int64_t index) const;
  // Elements [offset, offset + numel(shape)) of this tensor's flat data, as `shape`.
  Tensor flat_view(int64_t offset, const Shape& shape) const;

  // ---- copies -------------------------------------------------------------------------------
  // Copies `src` into this tensor, converting dtype and crossing devices as
  // needed. The element counts must match (shapes may differ, row-major order).
  void copy_from(const Tensor& src) const;
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  Tensor clone() const;
  // Sets every element to `value` (converted to the dtype; integers truncate toward zero).
  void fill(double value) const;
  void zero() const { fill(0.0); }
  // The elements, converted to T, on the host. Synchronises with the device.
  template <typename T>
  std::vector<T> to_vector() const;
  // The single element of a one-element tensor, converted to T.
  template <typename T>
  T item() const;

  // "f32[2, 3] cpu"
  std::string str() const;

 private:
  Tensor(std::shared_ptr<Storage> storage, size_t offset, Shape shape, DType dtype);
  void check_dtype(DType expected, const char* what) const;
  void check_defined(const char* what) const;
  // Copies `count` elements of raw host data of `src_dtype` into this tensor.
  void copy_from_host(const void* src, DType src_dtype, int64_t count) const;
  // Copies this tensor's elements to host memory as `dst_dtype`.
  void copy_to_host(void* dst, DType dst_dtype) const;

  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::f32;
};

std::ostream& operator<<(std::ostream& out, const Tensor& tensor);

// ---- template definitions ---------------------------------------------------------------------

template <typename T>
Tensor Tensor::from_vector(std::span<const T> values, const Shape& shape, Device device) {
  LOOM_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
             "from_vector: ", values.size(), " values do not fill shape ", shape_str(shape), " (",
             shape_numel(shape), " elements)");
  Tensor t = empty(shape, dtype_of<T>(), device);
  t.copy_from_host(values.data(), dtype_of<T>(), static_cast<int64_t>(values.size()));
  return t;
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  check_defined("to_vector()");
  std::vector<T> out(static_cast<size_t>(numel_));
  copy_to_host(out.data(), dtype_of<T>());
  return out;
}

template <typename T>
T Tensor::item() const {
  LOOM_CHECK(numel_ == 1, "item(): tensor ", str(), " has ", numel_,
             " elements; item() needs exactly one");
  return to_vector<T>()[0];
}

}  // namespace loom
