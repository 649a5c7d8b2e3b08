// Internal: the common part of the check macros for third-party library calls.
//
// Each library has its own macro next to the code that uses it:
//   LOOM_CUDA_CHECK, LOOM_CUBLAS_CHECK, LOOM_CUDNN_CHECK, LOOM_NCCL_CHECK  (core/cuda/check.hpp)
//   LOOM_MPI_CHECK                                                         (core/mpi_check.hpp)
// All of them throw loom::LibraryError recording the library, its error code
// and string, the statement as written, and the file and line.
#pragma once

#include <string>

namespace loom::detail {

[[noreturn]] void throw_library_error(const char* library, long code,
                                      const std::string& library_message, const char* call,
                                      const char* file, int line);

}  // namespace loom::detail
