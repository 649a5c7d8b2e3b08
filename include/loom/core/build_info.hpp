// What this Loom was built with and what it finds at run time, for logs and
// bug reports (tools/loom-info prints it).
#pragma once

#include <string>

namespace loom {

struct BuildInfo {
  std::string version;        // "0.1.0"
  std::string compiler;       // "GCC 12.2.0"
  bool cuda = false;          // built with the CUDA backend
  bool nccl = false;          // built with NCCL
  std::string cuda_versions;  // "CUDA runtime 13.0, driver 12.8, cuBLAS 13.0.0, cuDNN 9.x,
                              // NCCL 2.x" ("" without CUDA)
  std::string mpi_library;    // MPI_Get_library_version, first line
  int cuda_devices = 0;
  std::string cuda_unavailable_reason;  // "" when a device is usable
};

BuildInfo build_info();
// Several lines of human-readable text.
std::string build_summary();

}  // namespace loom
