// The peer for host GEMM: OpenBLAS's single-threaded sgemm, loaded at run time
// (Debian's libopenblas0-pthread) so Loom never links it. When the library is
// missing, available() is false and the benchmark says so. bf16 GEMMs (bf16 A
// and B, f32 C) have cblas_sbgemm as their peer where the library has it
// (OpenBLAS built with BUILD_BFLOAT16; Debian 12's 0.3.21 is not).
#pragma once

#include <cstdint>
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
  bool has_sbgemm() const { return sbgemm_ != nullptr; }
  // The same with A and B bf16 (bit patterns) and C f32.
  void sbgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const uint16_t* a,
              const uint16_t* b, float beta, float* c) const;

 private:
  using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*,
                           int, float, float*, int);
  using SbgemmFn = void (*)(int, int, int, int, int, int, float, const uint16_t*, int,
                            const uint16_t*, int, float, float*, int);
  void* handle_ = nullptr;
  SgemmFn sgemm_ = nullptr;
  SbgemmFn sbgemm_ = nullptr;
  std::string description_;
};

}  // namespace loom::bench
