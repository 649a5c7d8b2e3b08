#include "openblas_peer.hpp"

#include <dlfcn.h>

namespace loom::bench {
namespace {
// CBLAS enum values (cblas.h), so that no BLAS header is needed at build time.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
}  // namespace

OpenBlasPeer::OpenBlasPeer() {
  for (const char* name : {"libopenblas.so.0", "libopenblasp.so.0", "libopenblas.so"}) {
    handle_ = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle_) {
      description_ = name;
      break;
    }
  }
  if (!handle_) {
    description_ = "OpenBLAS not found (install libopenblas0-pthread)";
    return;
  }
  if (auto set_threads =
          reinterpret_cast<void (*)(int)>(dlsym(handle_, "openblas_set_num_threads"))) {
    set_threads(1);
  }
  if (auto config = reinterpret_cast<const char* (*)()>(dlsym(handle_, "openblas_get_config"))) {
    description_ += std::string(" (") + config() + ", 1 thread)";
  }
  sgemm_ = reinterpret_cast<SgemmFn>(dlsym(handle_, "cblas_sgemm"));
  if (!sgemm_) description_ += ": no cblas_sgemm symbol";
  sbgemm_ = reinterpret_cast<SbgemmFn>(dlsym(handle_, "cblas_sbgemm"));
  description_ += sbgemm_ ? "; bf16: cblas_sbgemm" : "; no cblas_sbgemm (bf16 GEMMs have no peer)";
}

OpenBlasPeer::~OpenBlasPeer() {
  if (handle_) dlclose(handle_);
}

void OpenBlasPeer::sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                         const float* a, const float* b, float beta, float* c) const {
  const int lda = trans_a ? m : k;
  const int ldb = trans_b ? k : n;
  sgemm_(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans, m, n, k, alpha, a,
         lda, b, ldb, beta, c, n);
}

void OpenBlasPeer::sbgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                          const uint16_t* a, const uint16_t* b, float beta, float* c) const {
  const int lda = trans_a ? m : k;
  const int ldb = trans_b ? k : n;
  sbgemm_(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans, m, n, k, alpha, a,
          lda, b, ldb, beta, c, n);
}

}  // namespace loom::bench
