#include "loom/core/tensor.hpp"

#include <cstring>
#include <sstream>

#include "core/primitives.hpp"
#include "loom/config.hpp"
#include "loom/core/stream.hpp"

#if LOOM_HAS_CUDA
#include "core/cuda/runtime.hpp"
#endif

namespace loom {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (const int64_t d : shape) {
    LOOM_CHECK(d >= 0, "shape ", shape_str(shape), " has a negative dimension");
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

Tensor::Tensor(std::shared_ptr<Storage> storage, size_t offset, Shape shape, DType dtype)
    : storage_(std::move(storage)),
      offset_(offset),
      shape_(std::move(shape)),
      numel_(shape_numel(shape_)),
      dtype_(dtype) {
  LOOM_ASSERT(offset_ + nbytes() <= storage_->nbytes(), "view of ", nbytes(), " bytes at offset ",
              offset_, " exceeds storage of ", storage_->nbytes(), " bytes");
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  const int64_t n = shape_numel(shape);
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
  return Tensor(Storage::allocate(bytes, device, current_stream(device)), 0, shape, dtype);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill(0.0);
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill(value);
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device,
                         std::function<void()> release) {
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  LOOM_CHECK(data != nullptr || bytes == 0, "from_blob: null data for shape ", shape_str(shape));
  return Tensor(Storage::wrap(data, bytes, device, std::move(release)), 0, shape, dtype);
}

Device Tensor::device() const {
  return storage_ ? storage_->device() : Device::cpu();
}

void* Tensor::data() const {
  check_defined("data()");
  auto* base = static_cast<char*>(storage_->data());
  return base == nullptr ? nullptr : base + offset_;
}

int64_t Tensor::size(int64_t d) const {
  const int64_t rank = dim();
  LOOM_CHECK(d >= -rank && d < rank, "dimension ", d, " is out of range for tensor ", str(),
             " of rank ", rank);
  return shape_[static_cast<size_t>(d < 0 ? d + rank : d)];
}

void Tensor::check_dtype(DType expected, const char* what) const {
  check_defined(what);
  LOOM_CHECK(dtype_ == expected, what, ": tensor ", str(), " has dtype ", dtype_, ", not ",
             expected);
}

void Tensor::check_defined(const char* what) const {
  LOOM_CHECK(defined(), what, " called on an undefined tensor");
}

// ---- views ------------------------------------------------------------------------------------

Tensor Tensor::view(const Shape& shape) const {
  check_defined("view()");
  Shape resolved = shape;
  int64_t known = 1;
  int inferred = -1;
  for (size_t i = 0; i < resolved.size(); ++i) {
    if (resolved[i] == -1) {
      LOOM_CHECK(inferred < 0, "view", shape_str(shape), " of ", str(),
                 ": at most one dimension may be -1");
      inferred = static_cast<int>(i);
    } else {
      LOOM_CHECK(resolved[i] >= 0, "view", shape_str(shape), " of ", str(),
                 ": dimensions must be >= 0 or -1");
      known *= resolved[i];
    }
  }
  if (inferred >= 0) {
    LOOM_CHECK(known != 0 && numel_ % known == 0, "view", shape_str(shape), " of ", str(), ": ",
               numel_, " elements cannot be split into this shape");
    resolved[static_cast<size_t>(inferred)] = numel_ / known;
  }
  LOOM_CHECK(shape_numel(resolved) == numel_, "view", shape_str(shape), " of ", str(), ": ",
             shape_numel(resolved), " elements, but the tensor has ", numel_);
  return Tensor(storage_, offset_, std::move(resolved), dtype_);
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  check_defined("slice()");
  LOOM_CHECK(dim() >= 1, "slice(", begin, ", ", end, ") of ", str(), ": needs rank >= 1");
  LOOM_CHECK(0 <= begin && begin <= end && end <= shape_[0], "slice(", begin, ", ", end, ") of ",
             str(), ": needs 0 <= begin <= end <= ", shape_[0]);
  Shape shape = shape_;
  shape[0] = end - begin;
  const int64_t row = shape_[0] == 0 ? 0 : numel_ / shape_[0];
  return Tensor(storage_, offset_ + static_cast<size_t>(begin * row) * element_size(),
                std::move(shape), dtype_);
}

Tensor Tensor::select(int64_t index) const {
  check_defined("select()");
  LOOM_CHECK(dim() >= 1 && index >= 0 && index < shape_[0], "select(", index, ") of ", str(),
             ": needs rank >= 1 and 0 <= index < ", dim() >= 1 ? shape_[0] : 0);
  Shape shape(shape_.begin() + 1, shape_.end());
  const int64_t row = numel_ / shape_[0];
  return Tensor(storage_, offset_ + static_cast<size_t>(index * row) * element_size(),
                std::move(shape), dtype_);
}

Tensor Tensor::flat_view(int64_t offset, const Shape& shape) const {
  check_defined("flat_view()");
  const int64_t n = shape_numel(shape);
  LOOM_CHECK(offset >= 0 && offset + n <= numel_, "flat_view(", offset, ", ", shape_str(shape),
             ") of ", str(), ": elements [", offset, ", ", offset + n,
             ") are outside the tensor's ", numel_, " elements");
  return Tensor(storage_, offset_ + static_cast<size_t>(offset) * element_size(), shape, dtype_);
}

// ---- copies -----------------------------------------------------------------------------------

void Tensor::copy_from(const Tensor& src) const {
  check_defined("copy_from()");
  LOOM_CHECK(src.defined(), "copy_from: source tensor is undefined");
  LOOM_CHECK(src.numel_ == numel_, "copy_from: source ", src.str(), " has ", src.numel_,
             " elements, destination ", str(), " has ", numel_);
  if (numel_ == 0) return;
  const Device from = src.device();
  const Device to = device();
  if (from.is_cpu() && to.is_cpu()) {
    detail::host_convert(src.data(), src.dtype_, data(), dtype_, numel_);
    return;
  }
#if LOOM_HAS_CUDA
  namespace rt = detail::cuda;
  if (from == to) {  // same CUDA device
    DeviceGuard guard(to);
    const Stream stream = current_stream(to);
    if (src.dtype_ == dtype_) {
      rt::memcpy(data(), src.data(), nbytes(), rt::CopyKind::device_to_device,
                 stream.native_handle());
    } else {
      rt::convert(src.data(), src.dtype_, data(), dtype_, numel_, stream.native_handle());
    }
    return;
  }
  if (from.is_cpu()) {  // host -> device: convert on the host first if needed
    if (src.dtype_ == dtype_) {
      DeviceGuard guard(to);
      rt::memcpy(data(), src.data(), nbytes(), rt::CopyKind::host_to_device,
                 current_stream(to).native_handle());
    } else {
      copy_from(src.to(dtype_));
    }
    return;
  }
  if (to.is_cpu()) {  // device -> host
    if (src.dtype_ == dtype_) {
      DeviceGuard guard(from);
      rt::memcpy(data(), src.data(), nbytes(), rt::CopyKind::device_to_host,
                 current_stream(from).native_handle());
    } else {
      copy_from(src.to(dtype_));
    }
    return;
  }
  // Between two CUDA devices: stage through the host (peer access is not assumed).
  copy_from(src.to(Device::cpu()));
#else
  throw InternalError("unreachable: CUDA tensor without CUDA build");
#endif
}

Tensor Tensor::to(Device device) const {
  check_defined("to(Device)");
  Tensor out = empty(shape_, dtype_, device);
  out.copy_from(*this);
  return out;
}

Tensor Tensor::to(DType dtype) const {
  check_defined("to(DType)");
  Tensor out = empty(shape_, dtype, device());
  out.copy_from(*this);
  return out;
}

Tensor Tensor::clone() const {
  return to(device());
}

void Tensor::fill(double value) const {
  check_defined("fill()");
  if (numel_ == 0) return;
  if (device().is_cpu()) {
    detail::host_fill(data(), dtype_, numel_, value);
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(device());
  detail::cuda::fill(data(), dtype_, numel_, value, current_stream(device()).native_handle());
#endif
}

void Tensor::copy_from_host(const void* src, DType src_dtype, int64_t count) const {
  LOOM_ASSERT(count == numel_);
  const Tensor host = from_blob(const_cast<void*>(src), shape_, src_dtype, Device::cpu());
  copy_from(host);
}

void Tensor::copy_to_host(void* dst, DType dst_dtype) const {
  const Tensor host = from_blob(dst, shape_, dst_dtype, Device::cpu());
  host.copy_from(*this);
}

std::string Tensor::str() const {
  if (!defined()) return "undefined";
  return str_cat(dtype_, shape_str(shape_), " ", device());
}

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) {
  return out << tensor.str();
}

}  // namespace loom
