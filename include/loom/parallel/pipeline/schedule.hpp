// A pipeline schedule as data (docs/design.md, decision 6; docs/pipeline.md).
//
// The model is cut into `chunks()` = pp * virtual_stages chunks, numbered in
// dataflow order: chunk 0 takes the input, the last chunk computes the loss.
// Each rank holds virtual_stages of them; `placement[c]` says which rank holds
// chunk c and at which of its virtual stages (0 = the rank's first chunk).
// Plain schedules hold chunk r on rank r; interleaved 1F1B holds chunk
// j * pp + r as rank r's virtual stage j; ZB-V holds chunks r and 2pp-1-r on
// rank r (the V).
//
// A schedule is, per rank, the list of actions that rank runs in order:
//
//   F   forward of micro-batch m on chunk c
//   B   backward-input: the gradient of chunk c's input (what the chunk
//       before it waits for)
//   W   backward-weight: the gradient of chunk c's weights (nobody waits)
//   BW  backward: B and W fused
//   send/recv activation: the output of chunk c's forward, from the rank of
//       chunk c to the rank of chunk c + 1
//   send/recv gradient: the gradient of chunk c's input (from B or BW), from
//       the rank of chunk c to the rank of chunk c - 1
//   reduce gradients: this rank's weight gradients are final for the step
//   optimizer step
//
// A message is named by the chunk that produced it. Two chunks on the same
// rank next to each other (ZB-V's turn at the last rank) pass the tensor
// locally: no message. An activation is "in flight" on a rank from its F
// until its W (or BW): that is what the rank must keep alive.
// `activation_bound` is the schedule's stated limit on that count, per rank,
// in chunk activations (one chunk activation is 1 / virtual_stages of a
// plain stage's when the model is cut into equal chunks).
//
// lower_communication adds the messages to a schedule that has only compute
// (and reduce / optimizer) actions: each receive right before the compute that
// needs it, each send right after the compute that produces it.
//
// validate_schedule (pipeline/validate.hpp) checks a schedule without any
// communication; format_grid (pipeline/print.hpp) draws it; simulate
// (pipeline/simulate.hpp) times it.
#pragma once

#include <string>
#include <vector>

namespace loom::parallel::pipeline {

enum class ActionKind {
  forward,
  backward_input,
  backward_weight,
  backward,  // backward_input and backward_weight fused
  send_activation,
  recv_activation,
  send_gradient,
  recv_gradient,
  reduce_gradients,
  optimizer_step,
};

struct Action {
  ActionKind kind = ActionKind::forward;
  int micro_batch = -1;  // -1 for reduce_gradients and optimizer_step
  int chunk = -1;        // -1 for reduce_gradients and optimizer_step
  int peer = -1;         // the other rank of a send or receive, else -1

  static Action forward(int micro_batch, int chunk) {
    return {ActionKind::forward, micro_batch, chunk};
  }
  static Action backward_input(int micro_batch, int chunk) {
    return {ActionKind::backward_input, micro_batch, chunk};
  }
  static Action backward_weight(int micro_batch, int chunk) {
    return {ActionKind::backward_weight, micro_batch, chunk};
  }
  static Action backward(int micro_batch, int chunk) {
    return {ActionKind::backward, micro_batch, chunk};
  }
  static Action send_activation(int micro_batch, int chunk, int to) {
    return {ActionKind::send_activation, micro_batch, chunk, to};
  }
  static Action recv_activation(int micro_batch, int chunk, int from) {
    return {ActionKind::recv_activation, micro_batch, chunk, from};
  }
  static Action send_gradient(int micro_batch, int chunk, int to) {
    return {ActionKind::send_gradient, micro_batch, chunk, to};
  }
  static Action recv_gradient(int micro_batch, int chunk, int from) {
    return {ActionKind::recv_gradient, micro_batch, chunk, from};
  }
  static Action reduce_gradients() { return {ActionKind::reduce_gradients}; }
  static Action optimizer_step() { return {ActionKind::optimizer_step}; }

  friend bool operator==(const Action&, const Action&) = default;
};

// F, B, W and BW.
bool is_compute(ActionKind kind);
// The four send and receive kinds.
bool is_message(ActionKind kind);
bool is_send(ActionKind kind);
bool is_recv(ActionKind kind);

// "forward of micro-batch 2 chunk 0", "recv activation of micro-batch 2
// chunk 0 from rank 0", "reduce gradients".
std::string describe(const Action& action);
// The grid's cell for a compute action: "F3", "B3", "W3", "BW3"; with
// show_chunk, "F3:5" (micro-batch 3 on chunk 5).
std::string label(const Action& action, bool show_chunk);

struct ChunkPlace {
  int rank = 0;
  int virtual_stage = 0;
  friend bool operator==(const ChunkPlace&, const ChunkPlace&) = default;
};

struct Schedule {
  std::string name;  // "1f1b", "zb-v", or whatever a hand-made schedule calls itself
  int pp = 1;
  int micro_batches = 1;
  int virtual_stages = 1;                  // chunks per rank
  std::vector<ChunkPlace> placement;       // per chunk, pp * virtual_stages entries
  std::vector<std::vector<Action>> ranks;  // per rank, the actions in the order they run
  int activation_bound = 1;                // chunk activations in flight per rank, at most

  int chunks() const { return pp * virtual_stages; }
  int rank_of(int chunk) const { return placement.at(chunk).rank; }
};

// Chunk c on rank c % pp as virtual stage c / pp (plain and interleaved).
std::vector<ChunkPlace> round_robin_placement(int pp, int virtual_stages);
// Chunks r and 2pp-1-r on rank r, as its virtual stages 0 and 1 (ZB-V).
std::vector<ChunkPlace> v_shape_placement(int pp);

// The schedule with its sends and receives added. `compute_only` must hold no
// message yet (loom::Error naming the first one otherwise); its placement
// must cover pp * virtual_stages chunks on ranks 0..pp-1.
Schedule lower_communication(const Schedule& compute_only);

}  // namespace loom::parallel::pipeline
