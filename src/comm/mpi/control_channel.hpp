// Internal: the control channel of one mpi communicator.
//
// NOTE [control channel]
// Each communicator has a second MPI communicator (MPI_Comm_dup of its own)
// for control messages, serviced by the progress thread through a receive
// that is always posted (MPI_ANY_SOURCE, MPI_ANY_TAG). Messages:
//   status query(n) -> the receiver answers with the number of the last
//                    collective it has issued on the communicator, how many
//                    splits of it it has called, and, when n > 0, what its
//                    collective number n was (op, count, dtype, root, its name
//                    for the group; from its flight recorder), so that a
//                    timeout can name ranks that called different collectives
//                    (NOTE [timeout diagnosis] in communicator.cpp);
//   status reply  -> fills in a pending query of peer_progress();
//   abort(origin, reason)
//                 -> the receiver aborts its communicator: its pending works
//                    fail with CommError{peer_failed} naming the rank that
//                    started the abort, and it passes the message on; then it
//                    answers the sender with
//   abort ack     -> the receiver has logged the abort and failed its works:
//                    a rank that is ending (NOTE [failing rank]) asks for
//                    these and waits for them before it goes, so its peers
//                    learn why.
//   departure(list) -> on the world's channel only: the sender leaves the
//                    groups listed (its program ends, or it lets one go); a
//                    line per group gives its key and what the sender issued
//                    there (NOTE [departing rank] in progress_engine.hpp).
//
// NOTE [stale control messages]
// A control message must not be in flight on a channel when its receiver frees
// the channel's communicators: Open MPI reuses the context id for the next
// communicator, where the stale message is matched by the new channel's
// receive and takes the message sequence number that a real message then
// waits behind forever (seen: an abort ack sent on an aborted group, received
// by the next group split, whose status reply never arrived). So nothing is
// sent that the receiver does not wait for, except aborts (which a rank that
// already aborted may receive late) and abort acks, which only a failing rank
// asks for: it never frees its communicators (ProgressEngine::fail_process).
// Nor is an abort sent to a rank known to have left the group (NOTE
// [departing rank]): it may have freed the channel already.
// Aborts passed on between surviving ranks (each passes an abort on, in case
// its origin died) can arrive after the receiver, which had aborted too, freed
// the group: so an aborted group's control communicator is never freed (one
// MPI communicator per aborted group, until MPI_Finalize), and a late abort
// lands on a context id nothing else will use. (Seen: the next group of a
// program that caught the abort and went on was aborted by it, test "an abort
// passed on between ranks does not reach the group made next".) A group freed
// normally while a peer aborts it keeps a narrow window.
// Because the progress thread services it even when the rank is busy
// elsewhere (computing, or blocked in another wait), a timeout can tell "rank
// 2 has not called it (its last collective is #1)" from "rank 2 did not
// answer". The debug cross-check (LOOM_DEBUG_COLLECTIVES) runs its
// MPI_Iallgather on this communicator too, so it never mixes with data.
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/comm/types.hpp"

namespace loom::comm::mpi {

class ProgressEngine;

// The communicator behind a channel, as the progress thread sees it.
class ControlPeer {
 public:
  virtual ~ControlPeer() = default;
  virtual uint64_t last_issued_seq() const = 0;
  // (The same as Communicator::splits_issued.)
  virtual uint64_t splits_issued() const = 0;
  // The collective it issued as number `seq`, if it still knows it.
  virtual std::optional<OpInfo> issued_collective(uint64_t seq) const = 0;
  // Rank `origin` aborted the communicator (called on the progress thread).
  virtual void on_peer_abort(int origin, const std::string& reason) = 0;
  // This rank aborts the communicator (any thread): Communicator::abort.
  virtual void abort_group(const std::string& reason) = 0;
  // NOTE [departing rank] (progress thread).
  // The same on every member and on no other group: "world", then
  // "/<split number>:<color>" per split.
  virtual const std::string& group_key() const = 0;
  virtual int group_size() const = 0;
  virtual int world_rank_of(int group_rank) const = 0;
  virtual int group_rank_of(int world_rank) const = 0;  // -1: not a member
  virtual int group_rank() const = 0;
  virtual std::vector<uint64_t> p2p_issued(OpType op) const = 0;  // Communicator::p2p_issued
  // Group rank `rank` left the group; `departure` is what it had issued here.
  virtual void on_peer_departed(int rank, const Communicator::Departure& departure) = 0;
};

class ControlChannel : public std::enable_shared_from_this<ControlChannel> {
 public:
  enum Kind : int { status_query = 1, status_reply = 2, abort = 3, abort_ack = 4, departure = 5 };
  static constexpr size_t kMaxText = 8192;  // longer texts are cut

  // Takes ownership of both communicators (freed by close()).
  ControlChannel(uint64_t id, MPI_Comm data, MPI_Comm control, int rank, int size,
                 std::weak_ptr<ControlPeer> peer);

  uint64_t id() const { return id_; }
  std::shared_ptr<ControlPeer> peer() const { return peer_.lock(); }
  MPI_Comm data() const { return data_; }
  MPI_Comm control() const { return control_; }

  // ---- progress thread -----------------------------------------------------------------------
  void post_receive();
  MPI_Request* receive_request() { return &receive_request_; }
  MPI_Status* receive_status() { return &receive_status_; }
  // The receive completed: handle the message and post the receive again.
  void on_receive(ProgressEngine& engine);
  // Cancels the receive and frees both communicators; with keep_control, the
  // control communicator stays allocated (an aborted group's: NOTE [stale
  // control messages]).
  void close(bool keep_control = false);

  // ---- any thread ----------------------------------------------------------------------------
  // How far one rank has got on the communicator.
  struct Progress {
    uint64_t last_collective = 0;
    uint64_t splits = 0;
    std::optional<OpInfo> call;  // its collective number `asked` (query_progress)
  };
  // Asks every peer how far it has got and, when `asked` > 0, what its
  // collective of that number was; waits at most `wait` for the answers.
  // Entry r is nullopt when rank r did not answer.
  std::vector<std::optional<Progress>> query_progress(ProgressEngine& engine, Progress own,
                                                      Milliseconds wait, uint64_t asked = 0);
  // Sends abort(origin, reason) to every peer (on the progress thread, best
  // effort). A rank that receives one passes it on unchanged, in case the
  // origin died before reaching everybody. `ask_acknowledgement`: the peers
  // answer with an abort ack (NOTE [stale control messages]: only a rank that
  // will not free this channel may ask).
  void broadcast_abort(ProgressEngine& engine, int origin, const std::string& reason,
                       bool ask_acknowledgement = false);
  // Every rank this one sent an abort to has acknowledged it or has left the
  // group (true when none was sent).
  bool abort_acknowledged() const;
  // NOTE [departing rank]: rank `rank` left the group; it acknowledges nothing.
  void peer_left(int rank);
  // Whether rank `rank` of the group is known to have left it (it needs no
  // departure notice: it may have ended, and a message to it never complete).
  bool has_left(int rank) const;
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Sends departure(list) to ranks `to` of this channel (progress thread;
  // fire and forget).
  void send_departure(ProgressEngine& engine, const std::string& list, const std::vector<int>& to);

 private:
  struct Query {
    std::vector<std::optional<Progress>> answers;
    int missing = 0;
  };
  void send(ProgressEngine& engine, int dest, Kind kind, uint64_t a, uint64_t b,
            const std::string& text);

  const uint64_t id_;
  MPI_Comm data_, control_;
  const int rank_, size_;
  const std::weak_ptr<ControlPeer> peer_;
  std::vector<char> receive_buffer_;
  MPI_Request receive_request_ = MPI_REQUEST_NULL;
  MPI_Status receive_status_{};

  mutable std::mutex mutex_;  // guards the queries, the abort acknowledgements and left_
  std::condition_variable answered_;
  uint64_t next_query_ = 1;
  std::map<uint64_t, std::shared_ptr<Query>> queries_;
  std::set<int> abort_sent_to_, abort_acked_by_, left_;
};

}  // namespace loom::comm::mpi
