// mean_over: the mean of a value over the ranks of a communicator group, in
// one call (logging a loss or an accuracy across data-parallel ranks).
//
//   double loss = parallel::mean_over(*dp, local_loss);
//
// Collective: every rank of `group` must call it, in the same order as the
// group's other collectives; every rank gets the same result. A group of one
// rank returns the value without communicating.
//
//  - double: the ranks' values are all-gathered as 64-bit patterns and added
//    in rank order in double, so the mean is a double-precision value, bit
//    for bit the same on every rank. `device` is where the one-element
//    message lives: the CPU for the mpi and local backends, the group's CUDA
//    device for nccl (which moves device memory only).
//  - Tensor: a new tensor (same shape, dtype and device), the element-wise
//    mean (all_reduce with ReduceOp::avg in the tensor's dtype, on its
//    device); `value` is left unchanged.
#pragma once

#include "loom/comm/communicator.hpp"
#include "loom/core/device.hpp"
#include "loom/core/tensor.hpp"

namespace loom::parallel {

double mean_over(comm::Communicator& group, double value, Device device = Device::cpu());
Tensor mean_over(comm::Communicator& group, const Tensor& value);

}  // namespace loom::parallel
