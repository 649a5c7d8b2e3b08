// Small control collectives of the data-parallel layer: scalars and strings
// moved through tensors on the communicator's device (the nccl backend moves
// CUDA tensors only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/device.hpp"
#include "loom/nn/parameter.hpp"

namespace loom::parallel::detail {

// The minimum of `value` over the ranks of `comm`.
int64_t all_reduce_min(comm::Communicator& comm, int64_t value, Device device);
// Every rank's `value`, by rank, on every rank (one all-gather of 8 bytes
// per rank; the value itself, bits included). A group of one: {value}.
std::vector<double> all_gather_values(comm::Communicator& comm, double value, Device device);
// `text` of rank `root`, on every rank.
std::string broadcast_string(comm::Communicator& comm, const std::string& text, int root,
                             Device device);
// `values` of rank `root` (every rank passes the same count), on every rank.
std::vector<int64_t> broadcast_indices(comm::Communicator& comm, std::vector<int64_t> values,
                                       int root, Device device);

// "fc1.weight f32[4, 8]": what must agree across data-parallel ranks.
std::string describe_parameter(const nn::Parameter& param);
// Throws on every rank, naming the first parameter whose description differs
// between rank 0 and some rank, and both versions.
void check_parameter_agreement(comm::Communicator& comm, const std::vector<nn::Parameter*>& params,
                               Device device);

}  // namespace loom::parallel::detail
