#include "comm/mpi/control_channel.hpp"

#include <cstring>

#include "comm/cross_check.hpp"
#include "comm/mpi/progress_engine.hpp"
#include "core/mpi_check.hpp"
#include "loom/core/logging.hpp"

namespace loom::comm::mpi {
namespace {

// A control message: two numbers, then text (the abort reason, a status
// reply's body), at most this long.
constexpr size_t kHeaderBytes = 2 * sizeof(uint64_t);
// The second number of an abort: the sender waits for an abort ack.
constexpr uint64_t kAckRequested = 1;

// A status reply's body: the splits called, whether a call follows, the call
// (op, dtype, count, root, number, reduction, path options: detail::CallRecord's
// words), then its group name.
constexpr size_t kReplyWords = 2 + detail::CallRecord::kWords;

std::string encode_reply(uint64_t splits, const std::optional<OpInfo>& call) {
  int64_t words[kReplyWords] = {};
  words[0] = static_cast<int64_t>(splits);
  std::string group;
  if (call) {
    const detail::CallRecord record = detail::call_record(*call);
    words[1] = 1;
    words[2] = record.op;
    words[3] = record.dtype;
    words[4] = record.count;
    words[5] = record.peer;
    words[6] = record.seq;
    words[7] = record.reduce;
    words[8] = record.path;
    group = call->group;
  }
  std::string body(sizeof(words), '\0');
  std::memcpy(body.data(), words, sizeof(words));
  return body + group;
}

// nullopt when `body` is too short to be a reply.
std::optional<ControlChannel::Progress> decode_reply(uint64_t last_collective,
                                                     const std::string& body) {
  int64_t words[kReplyWords] = {};
  if (body.size() < sizeof(words)) return std::nullopt;
  std::memcpy(words, body.data(), sizeof(words));
  ControlChannel::Progress progress;
  progress.last_collective = last_collective;
  progress.splits = static_cast<uint64_t>(words[0]);
  if (words[1] != 0) {
    OpInfo call;
    call.op = static_cast<OpType>(words[2]);
    call.dtype = static_cast<DType>(words[3]);
    call.count = words[4];
    call.bytes = static_cast<size_t>(words[4]) * dtype_size(call.dtype);
    call.peer = static_cast<int>(words[5]);
    call.seq = static_cast<uint64_t>(words[6]);
    if (words[7] >= 0) call.reduce_op = static_cast<ReduceOp>(words[7]);
    call.overlaps_compute = (words[8] & detail::CallRecord::kOverlapsCompute) != 0;
    call.symmetric = (words[8] & detail::CallRecord::kSymmetric) != 0;
    call.group = body.substr(sizeof(words));
    progress.call = std::move(call);
  }
  return progress;
}

// A fire-and-forget send of one control message.
class ControlSend final : public MpiOp {
 public:
  ControlSend(MPI_Comm comm, int dest, int tag, std::vector<char> bytes)
      : comm_(comm), dest_(dest), tag_(tag), bytes_(std::move(bytes)) {}
  void start() override {
    LOOM_MPI_CHECK(MPI_Isend(bytes_.data(), static_cast<int>(bytes_.size()), MPI_BYTE, dest_, tag_,
                             comm_, new_request()));
  }
  void succeed() override {}
  void fail(std::exception_ptr error) override {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      LOOM_LOG_DEBUG("control message to rank ", dest_, " failed: ", e.what());
    }
  }
  std::string describe() const override {
    return str_cat("control message ", tag_, " to rank ", dest_);
  }

 private:
  MPI_Comm comm_;
  int dest_, tag_;
  std::vector<char> bytes_;
};

}  // namespace

ControlChannel::ControlChannel(uint64_t id, MPI_Comm data, MPI_Comm control, int rank, int size,
                               std::weak_ptr<ControlPeer> peer)
    : id_(id),
      data_(data),
      control_(control),
      rank_(rank),
      size_(size),
      peer_(std::move(peer)),
      receive_buffer_(kHeaderBytes + kMaxText) {}

void ControlChannel::post_receive() {
  LOOM_MPI_CHECK(MPI_Irecv(receive_buffer_.data(), static_cast<int>(receive_buffer_.size()),
                           MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, control_, &receive_request_));
}

void ControlChannel::on_receive(ProgressEngine& engine) {
  const MPI_Status status = receive_status_;
  int bytes = 0;
  MPI_Get_count(&status, MPI_BYTE, &bytes);
  uint64_t a = 0, b = 0;
  std::string text;
  if (bytes >= static_cast<int>(kHeaderBytes)) {
    std::memcpy(&a, receive_buffer_.data(), sizeof(a));
    std::memcpy(&b, receive_buffer_.data() + sizeof(a), sizeof(b));
    text.assign(receive_buffer_.data() + kHeaderBytes, static_cast<size_t>(bytes) - kHeaderBytes);
  }
  // Post again first: the handlers below may take a while (abort fails works).
  post_receive();
  const int source = status.MPI_SOURCE;
  switch (status.MPI_TAG) {
    case status_query: {
      // a: the query's id; b: the collective number asked about (0: none).
      const auto peer = peer_.lock();
      if (peer) {
        const std::optional<OpInfo> call =
            b > 0 ? peer->issued_collective(b) : std::optional<OpInfo>();
        send(engine, source, status_reply, a, peer->last_issued_seq(),
             encode_reply(peer->splits_issued(), call));
      }
      break;
    }
    case status_reply: {
      const std::optional<Progress> progress = decode_reply(b, text);
      if (!progress) {
        LOOM_LOG_WARN("control channel: ignoring a malformed status reply from rank ", source);
        break;
      }
      std::lock_guard lock(mutex_);
      const auto it = queries_.find(a);
      if (it != queries_.end() && !it->second->answers[static_cast<size_t>(source)]) {
        it->second->answers[static_cast<size_t>(source)] = *progress;
        if (--it->second->missing == 0) answered_.notify_all();
      }
      break;
    }
    case abort:
      if (const auto peer = peer_.lock()) peer->on_peer_abort(static_cast<int>(a), text);
      // NOTE [stale control messages]: only when asked for.
      if (b == kAckRequested) send(engine, source, abort_ack, 0, 0, "");
      break;
    case abort_ack: {
      std::lock_guard lock(mutex_);
      abort_acked_by_.insert(source);
      break;
    }
    case departure:
      if (const auto peer = peer_.lock()) engine.peer_departed(peer->world_rank_of(source), text);
      break;
    default:
      LOOM_LOG_WARN("control channel: ignoring message with tag ", status.MPI_TAG, " from rank ",
                    source);
  }
}

void ControlChannel::close(bool keep_control) {
  if (receive_request_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&receive_request_);
    MPI_Wait(&receive_request_, MPI_STATUS_IGNORE);
  }
  // MPI_Comm_free lets operations still pending on the communicator complete.
  if (control_ != MPI_COMM_NULL && !keep_control) MPI_Comm_free(&control_);
  control_ = MPI_COMM_NULL;  // closed: send() sends nothing
  if (data_ != MPI_COMM_NULL) MPI_Comm_free(&data_);
}

void ControlChannel::send(ProgressEngine& engine, int dest, Kind kind, uint64_t a, uint64_t b,
                          const std::string& text) {
  if (control_ == MPI_COMM_NULL) return;  // closed
  const size_t length = std::min(text.size(), kMaxText);
  std::vector<char> bytes(kHeaderBytes + length);
  std::memcpy(bytes.data(), &a, sizeof(a));
  std::memcpy(bytes.data() + sizeof(a), &b, sizeof(b));
  std::memcpy(bytes.data() + kHeaderBytes, text.data(), length);
  auto op = std::make_unique<ControlSend>(control_, dest, kind, std::move(bytes));
  op->channel = 0;  // control traffic outlives an abort of its communicator
  engine.start_now(std::move(op));
}

std::vector<std::optional<ControlChannel::Progress>> ControlChannel::query_progress(
    ProgressEngine& engine, Progress own, Milliseconds wait, uint64_t asked) {
  auto query = std::make_shared<Query>();
  query->answers.resize(static_cast<size_t>(size_));
  query->answers[static_cast<size_t>(rank_)] = own;
  query->missing = size_ - 1;
  uint64_t id = 0;
  {
    std::lock_guard lock(mutex_);
    id = next_query_++;
    queries_[id] = query;
  }
  engine.post([self = shared_from_this(), id, asked, &engine] {
    for (int r = 0; r < self->size_; ++r) {
      if (r != self->rank_) self->send(engine, r, status_query, id, asked, "");
    }
  });
  std::unique_lock lock(mutex_);
  answered_.wait_for(lock, wait, [&] { return query->missing == 0; });
  queries_.erase(id);
  return query->answers;
}

void ControlChannel::broadcast_abort(ProgressEngine& engine, int origin, const std::string& reason,
                                     bool ask_acknowledgement) {
  if (ask_acknowledgement) {
    std::lock_guard lock(mutex_);
    for (int r = 0; r < size_; ++r) {
      if (r != rank_ && r != origin) abort_sent_to_.insert(r);
    }
  }
  const uint64_t flag = ask_acknowledgement ? kAckRequested : 0;
  engine.post([self = shared_from_this(), origin, reason, flag, &engine] {
    std::set<int> left;
    {
      std::lock_guard lock(self->mutex_);
      left = self->left_;
    }
    for (int r = 0; r < self->size_; ++r) {
      // Not to a rank that has left the group: it may have freed the channel,
      // whose context id the next group then reuses (NOTE [stale control messages]).
      if (r != self->rank_ && r != origin && !left.contains(r)) {
        self->send(engine, r, abort, static_cast<uint64_t>(origin), flag, reason);
      }
    }
  });
}

void ControlChannel::send_departure(ProgressEngine& engine, const std::string& list,
                                    const std::vector<int>& to) {
  for (const int r : to) {
    if (r != rank_ && r >= 0 && r < size_) send(engine, r, departure, 0, 0, list);
  }
}

void ControlChannel::peer_left(int rank) {
  std::lock_guard lock(mutex_);
  left_.insert(rank);
}

bool ControlChannel::has_left(int rank) const {
  std::lock_guard lock(mutex_);
  return left_.contains(rank);
}

bool ControlChannel::abort_acknowledged() const {
  std::lock_guard lock(mutex_);
  for (const int r : abort_sent_to_) {
    if (!abort_acked_by_.count(r) && !left_.count(r)) return false;
  }
  return true;
}

}  // namespace loom::comm::mpi
