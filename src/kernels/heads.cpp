// split_heads / merge_heads: argument checks, then one copy per group,
// dispatched by device.
#include "loom/kernels/heads.hpp"

#include <string>

#include "kernels/cpu/heads.hpp"
#include "kernels/heads_args.hpp"
#include "kernels/tensor_checks.hpp"
#include "loom/config.hpp"
#include "loom/core/stream.hpp"

#if LOOM_HAS_CUDA
#include "kernels/cuda/heads.cuh"
#endif

namespace loom::kernels {
namespace {

std::string describe(const char* op, const Tensor& packed, const std::vector<Tensor>& heads) {
  std::string all = str_cat(op, ": packed ", packed, ", heads {");
  for (size_t g = 0; g < heads.size(); ++g) all += str_cat(g == 0 ? "" : ", ", heads[g]);
  return all + "}";
}

// Checks the operands and returns the copy of group 0 (the others differ only in pointers).
detail::HeadCopy check(const char* op, const Tensor& packed, const std::vector<Tensor>& heads) {
  const std::string all = describe(op, packed, heads);
  LOOM_CHECK(!heads.empty(), op, ": needs at least one head tensor (", all, ")");
  LOOM_CHECK(packed.defined(), op, ": the packed tensor is undefined (", all, ")");
  LOOM_CHECK(packed.dim() == 3, op, ": the packed tensor must be [B, T, G * H * d]; got ", all);
  const Tensor& first = heads.front();
  for (const Tensor& h : heads) {
    LOOM_CHECK(h.defined(), op, ": a head tensor is undefined (", all, ")");
    LOOM_CHECK(h.dim() == 4, op, ": head tensors must be [B, H, T, d]; got ", all);
    LOOM_CHECK(h.shape() == first.shape(), op, ": every head tensor needs one shape; got ", all);
    LOOM_CHECK(h.dtype() == packed.dtype() && h.device() == packed.device(), op,
               ": every tensor needs one dtype and device; got ", all);
    LOOM_CHECK(!detail::overlaps(h, packed), op, ": a head tensor overlaps the packed tensor (",
               all, ")");
  }
  for (size_t g = 0; g < heads.size(); ++g) {
    for (size_t o = g + 1; o < heads.size(); ++o) {
      LOOM_CHECK(!detail::overlaps(heads[g], heads[o]), op, ": head tensors ", g, " and ", o,
                 " overlap (", all, ")");
    }
  }
  const int64_t groups = static_cast<int64_t>(heads.size());
  detail::HeadCopy c;
  c.element_size = packed.element_size();
  c.batch = first.size(0);
  c.heads = first.size(1);
  c.tokens = first.size(2);
  c.head_dim = first.size(3);
  c.packed_row = packed.size(2);
  LOOM_CHECK(packed.size(0) == c.batch && packed.size(1) == c.tokens &&
                 c.packed_row == groups * c.heads * c.head_dim,
             op, ": packed must be [B, T, G * H * d] = [", c.batch, ", ", c.tokens, ", ", groups,
             " * ", c.heads, " * ", c.head_dim, "] for ", groups,
             " head tensors [B, H, T, d]; got ", all);
  return c;
}

void run(detail::HeadCopy c, bool to_heads, const Tensor& packed,
         const std::vector<Tensor>& heads) {
  if (c.batch == 0 || c.tokens == 0 || c.heads == 0 || c.head_dim == 0) return;
  c.to_heads = to_heads;
  const size_t group_bytes = static_cast<size_t>(c.heads * c.head_dim) * c.element_size;
  auto group = [&](size_t g) {
    c.packed = static_cast<char*>(packed.data()) + g * group_bytes;
    c.head = heads[g].data();
    return c;
  };
  const Device device = packed.device();
  if (device.is_cpu()) {
    for (size_t g = 0; g < heads.size(); ++g) cpu::head_copy(group(g));
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(device);
  void* stream = current_stream(device).native_handle();
  for (size_t g = 0; g < heads.size(); ++g) cuda::head_copy(group(g), stream);
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

}  // namespace

void split_heads(const Tensor& packed, const std::vector<Tensor>& heads) {
  run(check("split_heads", packed, heads), true, packed, heads);
}

void merge_heads(const std::vector<Tensor>& heads, const Tensor& packed) {
  run(check("merge_heads", packed, heads), false, packed, heads);
}

OpCost heads_cost(const Tensor& packed) {
  return OpCost{0.0, 2.0 * static_cast<double>(packed.nbytes())};
}

}  // namespace loom::kernels
