#include "loom/parallel/reduction.hpp"

namespace loom::parallel {

std::string_view unused_parameters_name(UnusedParameters value) {
  switch (value) {
    case UnusedParameters::error:
      return "error";
    case UnusedParameters::zero_fill:
      return "zero_fill";
  }
  return "unknown";
}

ReductionGroups reduction_groups(const ParallelGroups& groups) {
  return {.tp = groups.tp.get(), .embedding = groups.embedding.get(), .model = groups.tp_pp.get()};
}

}  // namespace loom::parallel
