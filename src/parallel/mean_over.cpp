#include "loom/parallel/mean_over.hpp"

#include "loom/core/error.hpp"
#include "parallel/control.hpp"

namespace loom::parallel {

double mean_over(comm::Communicator& group, double value, Device device) {
  if (group.size() == 1) return value;
  double sum = 0;  // in rank order: the same bits on every rank
  for (const double v : detail::all_gather_values(group, value, device)) sum += v;
  return sum / group.size();
}

Tensor mean_over(comm::Communicator& group, const Tensor& value) {
  LOOM_CHECK(value.defined(), "mean_over: the value on rank ", group.rank(), " of group '",
             group.name(), "' is an undefined tensor");
  Tensor mean = value.clone();
  if (group.size() > 1) group.all_reduce(mean, {.op = comm::ReduceOp::avg}).wait();
  return mean;
}

}  // namespace loom::parallel
