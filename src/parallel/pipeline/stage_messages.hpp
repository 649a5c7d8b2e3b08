// StageMessages: the point-to-point messages of one pipeline rank, for the
// executor (pipeline/executor.hpp). Internal to parallel/pipeline/.
//
// NOTE [pipeline messages]
//  - Tags. A message is named, as in the schedule, by its kind, micro-batch m
//    and the chunk c that produced it. Its payload travels under
//      payload_tag = 2 * chunks + 2 * (c * M + m) + kind     (activation 0, gradient 1)
//    and its shape header under shape_tag = 2 * c + kind. Every message of a
//    step thus has a tag of its own: at pp = 2, or with two chunks per rank
//    (interleaved, ZB-V), activations and gradients go between the same two
//    ranks in both directions, often with the same shape [b, T, d], and a
//    receive posted ahead must not take the other kind's message. The tags
//    repeat from step to step, which is safe: messages between two ranks
//    under one tag arrive in the order they were sent (comm/types.hpp), and a
//    rank posts a step's receives only after taking all of the last step's.
//  - Shapes. The first message of each (kind, chunk) in the executor's life
//    is preceded by a header: int64 [dtype, ndim, d0, ..., d7]. Both ends
//    cache it; later payloads of that (kind, chunk) are received straight
//    into a tensor of the cached shape. A sender whose tensor differs from
//    what it announced throws instead of sending, since the receiver would
//    otherwise take a wrong-sized message.
//  - Receives posted ahead before the header has come (the first step) wait
//    for it: post() leaves them deferred, and take() of the receive that
//    carries the header posts their payloads once the shape is known. Takes
//    come in list order, so a deferred receive is never taken before the one
//    carrying its header.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/tensor.hpp"

namespace loom::parallel::pipeline::detail {

enum class MessageKind { activation = 0, gradient = 1 };

// NOTE [pipeline messages]. Arguments are not checked here (the executor checks
// max_message_tag against the communicator's range once).
int payload_tag(MessageKind kind, int micro_batch, int chunk, int chunks, int micro_batches);
int shape_tag(MessageKind kind, int chunk);
// The largest tag a schedule of `chunks` chunks and M micro-batches uses.
int max_message_tag(int chunks, int micro_batches);

class StageMessages {
 public:
  // Payloads are received into tensors on `device` (the rank's chunks'
  // device; the backend stages device memory as it must).
  StageMessages(comm::Communicator& pp, int chunks, int micro_batches, Device device);

  // Posts the send of `tensor` (the shape header first, the first time for
  // this kind and chunk). The tensor is kept alive until the send completes.
  void send(MessageKind kind, int micro_batch, int chunk, int peer, const Tensor& tensor);
  // Drops completed sends (cheap; keeps memory bounded during a step).
  void reap_sends();
  // Waits for every send; returns the seconds spent waiting.
  double wait_sends();

  // Posts a receive now, ahead of its take().
  void post(MessageKind kind, int micro_batch, int chunk, int peer);
  // Waits for a receive (posting it first if it was not) and returns its
  // payload. Adds the time spent blocked to `waited_seconds`.
  Tensor take(MessageKind kind, int micro_batch, int chunk, int peer, double& waited_seconds);
  // Receives posted and not taken (0 at the end of a step).
  size_t posted() const { return receives_.size(); }

  int64_t messages_sent() const { return messages_sent_; }
  int64_t bytes_sent() const { return bytes_sent_; }
  int64_t messages_received() const { return messages_received_; }
  void reset_counters();

 private:
  struct Key {
    MessageKind kind;
    int micro_batch;
    int chunk;
    friend auto operator<=>(const Key&, const Key&) = default;
  };
  struct Layout {
    Shape shape;
    DType dtype = DType::f32;
  };
  struct Receive {
    int peer = -1;
    bool carries_header = false;  // its header receive is posted
    Tensor header;
    comm::Work header_work;
    Tensor payload;  // undefined while deferred (the shape is not known yet)
    comm::Work payload_work;
  };
  struct PendingSend {
    comm::Work work;
    Tensor keep_alive;
  };

  void post_payload(const Key& key, Receive& receive);
  int tag_of(const Key& key) const;
  static std::string describe(const Key& key, int peer, bool send);

  comm::Communicator& pp_;
  int chunks_;
  int micro_batches_;
  Device device_;
  std::map<std::pair<MessageKind, int>, Layout> sent_layouts_;      // (kind, chunk)
  std::map<std::pair<MessageKind, int>, Layout> received_layouts_;  // (kind, chunk)
  std::map<Key, Receive> receives_;
  std::deque<PendingSend> sends_;
  int64_t messages_sent_ = 0;
  int64_t bytes_sent_ = 0;
  int64_t messages_received_ = 0;
};

}  // namespace loom::parallel::pipeline::detail
