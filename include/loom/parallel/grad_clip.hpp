// Gradient clipping by the true global norm of a model spread over data,
// tensor and pipeline parallel ranks (docs/design.md, decision 12).
//
//   norm^2 = sum over every element of the global model's gradient, once
//
// Each rank sums the squares of the gradient pieces it counts, then the sums
// are added over the ranks that hold different pieces:
//  - over `shards` (the data-parallel group when ZeRO shards the gradients;
//    null when every data-parallel rank holds the whole reduced gradient);
//  - over ReductionGroups::model (tp x pp of one replica).
// A piece counts on this rank unless it is a replica another rank counts: a
// parameter not sharded over tensor parallelism counts on tp rank 0 only, a
// copy of a weight tied across stages on the embedding group's rank 0 only.
// So a model in two pipeline parts, or split over tp, gives the one-rank norm
// (to rounding: the sums are added in double, carried as two f32 words).
//
// As optim::clip_grad_norm: a non-finite norm leaves the gradients alone and
// is returned as is; max_norm must be positive (infinity: never clip).
//
// grad_scale: the gradients hold grad_scale times the true gradients (loss
// scaling, optim/loss_scaler.hpp). The norm returned is the true one, and the
// same pass that clips divides the gradients by grad_scale (unless the norm
// is not finite: an overflow the scaler answers by skipping the step).
#pragma once

#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/tensor.hpp"
#include "loom/nn/parameter.hpp"
#include "loom/parallel/reduction.hpp"

namespace loom::parallel {

// A gradient, or a piece of one (a ZeRO shard's slice), with its parameter.
struct GradPiece {
  const nn::Parameter* param = nullptr;
  Tensor grad;
};

// Whether `param`'s gradient counts towards the norm on this rank.
bool counts_for_norm(const nn::Parameter& param, const ReductionGroups& groups);

// The global L2 norm of the pieces (collective over `shards` and groups.model).
double global_grad_norm(const std::vector<GradPiece>& pieces, const ReductionGroups& groups,
                        comm::Communicator* shards = nullptr);

// Clips the pieces in place when the global norm exceeds max_norm; returns the norm.
double clip_grad_norm(const std::vector<GradPiece>& pieces, const ReductionGroups& groups,
                      double max_norm, comm::Communicator* shards = nullptr,
                      double grad_scale = 1.0);
// Every parameter's whole gradient (data parallelism without ZeRO sharding).
double clip_grad_norm(const std::vector<nn::Parameter*>& params, const ReductionGroups& groups,
                      double max_norm, double grad_scale = 1.0);

}  // namespace loom::parallel
