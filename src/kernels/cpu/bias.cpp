// Host bias kernels: row-by-row loops over contiguous columns, which the
// compiler vectorises. The gradient sums rows in order into an f32 column
// buffer, so it is deterministic; 16-bit rows are widened as they are read.
#include "kernels/cpu/bias.hpp"

#include "kernels/cpu/float_io.hpp"

#include <cstddef>
#include <vector>

namespace loom::kernels::cpu {

void bias_add(float* y, const float* b, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * cols;
    for (int64_t c = 0; c < cols; ++c) row[c] += b[c];
  }
}

namespace {

template <typename T>
void column_sums(const T* dy, float* db, int64_t rows, int64_t cols, bool accumulate) {
  std::vector<float> sums(static_cast<size_t>(cols), 0.0f);
  float* s = sums.data();
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = dy + r * cols;
    for (int64_t c = 0; c < cols; ++c) s[c] += load_float(row[c]);
  }
  if (accumulate) {
    for (int64_t c = 0; c < cols; ++c) db[c] += s[c];
  } else {
    for (int64_t c = 0; c < cols; ++c) db[c] = s[c];
  }
}

}  // namespace

void bias_grad(const float* dy, float* db, int64_t rows, int64_t cols, bool accumulate) {
  column_sums(dy, db, rows, cols, accumulate);
}

void bias_grad(const bfloat16* dy, float* db, int64_t rows, int64_t cols, bool accumulate) {
  column_sums(dy, db, rows, cols, accumulate);
}

void bias_grad(const float16* dy, float* db, int64_t rows, int64_t cols, bool accumulate) {
  column_sums(dy, db, rows, cols, accumulate);
}

}  // namespace loom::kernels::cpu
