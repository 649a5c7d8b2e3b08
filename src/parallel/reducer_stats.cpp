#include <cstdio>

#include "loom/parallel/grad_reducer.hpp"

namespace loom::parallel {

std::string_view grad_compression_name(GradCompression value) {
  switch (value) {
    case GradCompression::none:
      return "none";
    case GradCompression::bf16:
      return "bf16";
    case GradCompression::f16:
      return "f16";
  }
  return "unknown";
}

std::string ReducerStats::summary() const {
  char line[256];
  std::snprintf(line, sizeof line,
                "step %lld: %lld buckets, %.2f MiB, compute %.2f ms, backward %.2f ms, comm "
                "%.2f ms, exposed %.2f ms (%.0f%% hidden)",
                static_cast<long long>(step), static_cast<long long>(buckets),
                static_cast<double>(wire_bytes) / (1024.0 * 1024.0), compute_s * 1e3,
                backward_s * 1e3, comm_s * 1e3, exposed_s * 1e3, hidden_fraction * 100.0);
  return line;
}

}  // namespace loom::parallel
