#include "loom/parallel/sync_batch_norm.hpp"

#include <memory>

namespace loom::parallel {

namespace {

// Forward: sums the per-channel sums and the element counts over the group.
// The count travels as an i64 tensor on the sums' device (the nccl backend
// moves device tensors only).
nn::BatchNorm2d::StatsReducer make_forward_reducer(std::shared_ptr<comm::Communicator> dp) {
  return [dp = std::move(dp)](const Tensor& sums, int64_t& count) {
    Tensor total = Tensor::from_vector(std::vector<int64_t>{count}, {1}, sums.device());
    comm::Work a = dp->all_reduce(sums, {.op = comm::ReduceOp::sum});
    comm::Work b = dp->all_reduce(total, {.op = comm::ReduceOp::sum});
    a.wait();
    b.wait();
    count = total.item<int64_t>();
  };
}

// Backward: sums the gradient sums only. The count BatchNorm passes here is
// the one the forward hook already made the group's total.
nn::BatchNorm2d::StatsReducer make_backward_reducer(std::shared_ptr<comm::Communicator> dp) {
  return [dp = std::move(dp)](const Tensor& sums, int64_t& count) {
    (void)count;
    dp->all_reduce(sums, {.op = comm::ReduceOp::sum}).wait();
  };
}

void collect(nn::Module& module, std::vector<nn::BatchNorm2d*>& out) {
  if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(&module)) out.push_back(bn);
  for (nn::Module* child : module.children()) collect(*child, out);
}

}  // namespace

void sync_batch_norm(nn::BatchNorm2d& bn, comm::Communicator& dp) {
  std::shared_ptr<comm::Communicator> owner = dp.shared_from_this();
  bn.set_stats_reducers(make_forward_reducer(owner), make_backward_reducer(owner));
}

void unsync_batch_norm(nn::BatchNorm2d& bn) {
  bn.set_stats_reducers({}, {});
}

std::vector<nn::BatchNorm2d*> find_batch_norms(nn::Module& root) {
  std::vector<nn::BatchNorm2d*> out;
  collect(root, out);
  return out;
}

size_t sync_batch_norms(nn::Module& root, comm::Communicator& dp) {
  const std::vector<nn::BatchNorm2d*> modules = find_batch_norms(root);
  for (nn::BatchNorm2d* bn : modules) sync_batch_norm(*bn, dp);
  return modules.size();
}

}  // namespace loom::parallel
