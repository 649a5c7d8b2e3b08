// Host embedding: row copies and row additions (contiguous, vectorised), in
// order of the ids.
#include "kernels/cpu/embedding.hpp"

#include <cstring>

namespace loom::kernels::cpu {
namespace {

template <typename Id, typename F>
void for_each_id(const void* ids, int64_t count, F&& f) {
  const Id* p = static_cast<const Id*>(ids);
  for (int64_t i = 0; i < count; ++i) f(i, static_cast<int64_t>(p[i]));
}

template <typename F>
void visit_ids(const void* ids, DType id_dtype, int64_t count, F&& f) {
  if (id_dtype == DType::i32) {
    for_each_id<int32_t>(ids, count, f);
  } else {
    for_each_id<int64_t>(ids, count, f);
  }
}

}  // namespace

int64_t first_id_out_of_range(const void* ids, DType id_dtype, int64_t count, int64_t vocab) {
  int64_t bad = -1;
  visit_ids(ids, id_dtype, count, [&](int64_t i, int64_t id) {
    if (bad < 0 && (id < 0 || id >= vocab)) bad = i;
  });
  return bad;
}

int64_t id_at(const void* ids, DType id_dtype, int64_t position) {
  return id_dtype == DType::i32 ? static_cast<const int32_t*>(ids)[position]
                                : static_cast<const int64_t*>(ids)[position];
}

void gather_rows(const void* table, size_t row_bytes, const void* ids, DType id_dtype,
                 int64_t count, void* out) {
  const auto* src = static_cast<const unsigned char*>(table);
  auto* dst = static_cast<unsigned char*>(out);
  const auto stride = static_cast<int64_t>(row_bytes);
  visit_ids(ids, id_dtype, count, [&](int64_t i, int64_t id) {
    std::memcpy(dst + i * stride, src + id * stride, row_bytes);
  });
}

void embedding_forward(const float* table, const void* ids, DType id_dtype, int64_t count,
                       int64_t dim, float* out) {
  gather_rows(table, static_cast<size_t>(dim) * sizeof(float), ids, id_dtype, count, out);
}

void embedding_backward(const float* dy, const void* ids, DType id_dtype, int64_t count,
                        int64_t dim, float* dtable) {
  visit_ids(ids, id_dtype, count, [&](int64_t i, int64_t id) {
    float* row = dtable + id * dim;
    const float* g = dy + i * dim;
    for (int64_t c = 0; c < dim; ++c) row[c] += g[c];
  });
}

}  // namespace loom::kernels::cpu
