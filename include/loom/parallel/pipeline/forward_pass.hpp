// A forward pass through the pipeline's stages outside a training step (a
// validation or test pass): no micro-batches, no backward, no tapes kept.
//
// `input` enters chunk 0 on the rank holding it and goes through every chunk
// in dataflow order, each run on the rank the schedule places it; between
// ranks each activation travels with a header (dtype and up to 6 dimensions)
// before its payload, so batches of any shape pass (nothing is cached). The
// messages use the two tags just below the communicator's 32768, above every
// tag the executor uses (2 x chunks x (M + 1) from 0; train_gpt and
// train_resnet check that they do not meet).
//
// Every rank of the pp group calls it, with the same schedule and its own
// chunks (one module per virtual stage, as the executor takes them); `input`
// is read only on the rank holding chunk 0. Returns the last chunk's output on
// the rank holding it and an empty Tensor on the others. The chunks run in
// whatever training mode they are in: set_training(false) first for
// evaluation (BatchNorm's running statistics, no dropout).
#pragma once

#include <functional>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/tensor.hpp"
#include "loom/nn/module.hpp"
#include "loom/parallel/pipeline/schedule.hpp"

namespace loom::parallel::pipeline {

inline constexpr int kForwardPassShapeTag = (1 << 15) - 2;
inline constexpr int kForwardPassPayloadTag = (1 << 15) - 1;

Tensor forward_through_stages(const Schedule& schedule, comm::Communicator& pp,
                              const std::vector<nn::Module*>& chunks, const Tensor& input,
                              Device device);

// The same with what runs each chunk given as a function of this rank's
// virtual stage and the chunk's input (e.g. cached generation's rows through
// a part, parallel/generate.hpp).
using RunChunk = std::function<Tensor(int virtual_stage, const Tensor& input)>;
Tensor forward_through_stages(const Schedule& schedule, comm::Communicator& pp,
                              const RunChunk& run_chunk, const Tensor& input, Device device);

// `value` as the rank `root` of `group` holds it, on every rank (its 8 bytes
// broadcast bit for bit).
double broadcast_double(comm::Communicator& group, double value, int root);

}  // namespace loom::parallel::pipeline
