#include "loom/core/build_info.hpp"

#include <mpi.h>

#include <sstream>

#include "loom/config.hpp"
#include "loom/core/device.hpp"

namespace loom {
namespace detail::cuda {
std::string library_versions();  // core/cuda/versions.cpp
}

BuildInfo build_info() {
  BuildInfo info;
  info.version = LOOM_VERSION_STRING;
#if defined(__clang__)
  info.compiler = "Clang " __clang_version__;
#elif defined(__GNUC__)
  info.compiler = "GCC " __VERSION__;
#endif
  info.cuda = built_with_cuda();
  info.nccl = built_with_nccl();
#if LOOM_HAS_CUDA
  info.cuda_versions = detail::cuda::library_versions();
#endif
  // MPI_Get_library_version may be called before MPI_Init.
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  if (MPI_Get_library_version(text, &length) == MPI_SUCCESS) {
    info.mpi_library = std::string(text, static_cast<size_t>(length));
    info.mpi_library = info.mpi_library.substr(0, info.mpi_library.find_first_of("\n,"));
  }
  info.cuda_devices = cuda_device_count();
  info.cuda_unavailable_reason = cuda_unavailable_reason();
  return info;
}

std::string build_summary() {
  const BuildInfo info = build_info();
  std::ostringstream out;
  out << "Loom " << info.version << " (" << info.compiler << ")\n"
      << "  CUDA backend: " << (info.cuda ? "built" : "not built")
      << ", NCCL: " << (info.nccl ? "built" : "not built") << "\n";
  if (!info.cuda_versions.empty()) out << "  " << info.cuda_versions << "\n";
  out << "  MPI: " << (info.mpi_library.empty() ? "unknown" : info.mpi_library) << "\n";
  out << "  CUDA devices: " << info.cuda_devices;
  if (info.cuda_devices == 0) out << " (" << info.cuda_unavailable_reason << ")";
  out << "\n";
  return out.str();
}

}  // namespace loom
