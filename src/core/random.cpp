#include "loom/core/random.hpp"

#include "core/primitives.hpp"
#include "loom/config.hpp"
#include "loom/core/stream.hpp"

namespace loom {
namespace detail {

ShardIndex make_shard_index(const Shape& shape, const ShardSpec* shard) {
  ShardIndex index;
  if (shard == nullptr) return index;
  const size_t dims = shape.size();
  LOOM_CHECK(shard->global_shape.size() == dims && shard->offsets.size() == dims, "shard of shape ",
             shape_str(shape), " has global shape ", shape_str(shard->global_shape),
             " and offsets ", shape_str(shard->offsets),
             "; all three must have the same number of dimensions");
  LOOM_CHECK(dims <= static_cast<size_t>(ShardIndex::kMaxDims), "shard of shape ", shape_str(shape),
             " has ", dims, " dimensions; at most ", ShardIndex::kMaxDims, " are supported");
  for (size_t d = 0; d < dims; ++d) {
    LOOM_CHECK(shard->offsets[d] >= 0 && shard->offsets[d] + shape[d] <= shard->global_shape[d],
               "shard of shape ", shape_str(shape), " at offsets ", shape_str(shard->offsets),
               " does not fit in global shape ", shape_str(shard->global_shape), " (dimension ", d,
               ": ", shard->offsets[d], " + ", shape[d], " > ", shard->global_shape[d], ")");
  }
  index.dims = static_cast<int>(dims);
  int64_t stride = 1;
  for (int d = index.dims - 1; d >= 0; --d) {
    index.local[d] = shape[static_cast<size_t>(d)];
    index.offsets[d] = shard->offsets[static_cast<size_t>(d)];
    index.global_strides[d] = stride;
    stride *= shard->global_shape[static_cast<size_t>(d)];
  }
  return index;
}

}  // namespace detail

namespace {

void fill_random(const Tensor& tensor, detail::RandomKind kind, RandomKey key, float a, float b,
                 const ShardSpec* shard, const char* what) {
  LOOM_CHECK(tensor.defined(), what, ": tensor is undefined");
  LOOM_CHECK(is_floating(tensor.dtype()), what, ": tensor ", tensor.str(),
             " must have a floating-point dtype (f32, bf16, f16)");
  const detail::ShardIndex index = detail::make_shard_index(tensor.shape(), shard);
  if (tensor.device().is_cpu()) {
    detail::host_fill_random(tensor.data(), tensor.dtype(), tensor.numel(), kind, key, a, b, index);
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(tensor.device());
  detail::cuda::fill_random(tensor.data(), tensor.dtype(), tensor.numel(), kind, key, a, b, index,
                            current_stream(tensor.device()).native_handle());
#endif
}

}  // namespace

uint64_t random_stream_id(std::string_view name) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (const char c : name) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

void fill_uniform(const Tensor& tensor, RandomKey key, float low, float high,
                  const ShardSpec* shard) {
  LOOM_CHECK(low <= high, "fill_uniform: low ", low, " must not exceed high ", high);
  fill_random(tensor, detail::RandomKind::uniform, key, low, high, shard, "fill_uniform");
}

void fill_normal(const Tensor& tensor, RandomKey key, float mean, float stddev,
                 const ShardSpec* shard) {
  LOOM_CHECK(stddev >= 0, "fill_normal: stddev ", stddev, " must be >= 0");
  fill_random(tensor, detail::RandomKind::normal, key, mean, stddev, shard, "fill_normal");
}

}  // namespace loom
