// Internal: LOOM_MPI_CHECK(call) for MPI calls made with MPI_ERRORS_RETURN.
//
// On failure throws loom::LibraryError with MPI_Error_string's text, e.g.
//   MPI error 2 (MPI_ERR_COUNT: invalid count argument) in `MPI_Send(...)` at comm/mpi.cpp:88
#pragma once

#include <mpi.h>

#include <string>

#include "core/library_check.hpp"

namespace loom::detail {

inline std::string mpi_error_string(int code) {
  // Open MPI aborts the process if MPI_Error_string is called before MPI_Init.
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return "no error string: MPI is not initialized";
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(text, static_cast<size_t>(length));
}

}  // namespace loom::detail

#define LOOM_MPI_CHECK(call)                                                                  \
  do {                                                                                        \
    const int loom_mpi_status_ = (call);                                                      \
    if (loom_mpi_status_ != MPI_SUCCESS) [[unlikely]] {                                       \
      ::loom::detail::throw_library_error("MPI", loom_mpi_status_,                            \
                                          ::loom::detail::mpi_error_string(loom_mpi_status_), \
                                          #call, __FILE__, __LINE__);                         \
    }                                                                                         \
  } while (false)
