// The peer for host GEMM: OpenBLAS's single-threaded sgemm, loaded at run time
// (Debian's libopenblas0-pthread) so Loom never links it. When the library is
// missing, available() is false and the benchmark says so.
#pragma once

#include <string>

namespace loom::bench {

class OpenBlasPeer {
 public:
  OpenBlasPeer();  // dlopens libopenblas.so.0 and pins it to one thread
  ~OpenBlasPeer();
  OpenBlasPeer(const OpenBlasPeer&) = delete;
  OpenBlasPeer& operator=(const OpenBlasPeer&) = delete;

  bool available() const { return sgemm_ != nullptr; }
  const std::string& description() const { return description_; }
  // Row-major C[m,n] = alpha * op(A) * op(B) + beta * C.
  void sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
             const float* b, float beta, float* c) const;

 private:
  using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                           int, float, float*, int);
  void* handle_ = nullptr;
  SgemmFn sgemm_ = nullptr;
  std::string description_;
};

}  // namespace loom::bench
