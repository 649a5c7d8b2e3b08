#include "loom/parallel/mean_over.hpp"

#include <bit>
#include <cstdint>
#include <vector>

#include "loom/core/error.hpp"

namespace loom::parallel {

double mean_over(comm::Communicator& group, double value, Device device) {
  if (group.size() == 1) return value;
  const Tensor mine =
      Tensor::from_vector(std::vector<int64_t>{std::bit_cast<int64_t>(value)}, {1}, device);
  const Tensor all = Tensor::empty({group.size()}, DType::i64, device);
  group.all_gather(mine, all).wait();
  double sum = 0;
  for (const int64_t bits : all.to_vector<int64_t>()) sum += std::bit_cast<double>(bits);
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
