#include "loom/comm/communicator.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <exception>
#include <numeric>

#include "comm/cross_check.hpp"
#include "comm/work_state.hpp"
#include "core/env.hpp"
#include "loom/core/logging.hpp"

namespace loom::comm {

namespace {

// "90", "1.5s", "250ms", "10m" from variable `name`; `also`: what else it takes.
Milliseconds parse_duration(const char* name, const std::string& value, const char* also = "") {
  size_t digits = 0;
  while (digits < value.size() &&
         (std::isdigit(static_cast<unsigned char>(value[digits])) || value[digits] == '.')) {
    ++digits;
  }
  const std::string unit = value.substr(digits);
  double number = 0;
  try {
    number = digits == 0 ? -1 : std::stod(value.substr(0, digits));
  } catch (const std::exception&) {
    number = -1;
  }
  double ms_per_unit = 0;
  if (unit.empty() || unit == "s") ms_per_unit = 1000;
  if (unit == "ms") ms_per_unit = 1;
  if (unit == "m" || unit == "min") ms_per_unit = 60000;
  LOOM_CHECK(number > 0 && ms_per_unit > 0, name, "='", value,
             "' must be a positive number of seconds, optionally with a unit: 90, 90s, 1500ms, 10m",
             also);
  return Milliseconds(static_cast<int64_t>(number * ms_per_unit));
}

}  // namespace

Milliseconds default_comm_timeout() {
  const char* text = std::getenv("LOOM_COMM_TIMEOUT");
  if (text == nullptr || *text == '\0') return std::chrono::minutes(10);
  return parse_duration("LOOM_COMM_TIMEOUT", text);
}

Milliseconds default_comm_stall_warning() {
  const char* text = std::getenv("LOOM_COMM_STALL_WARNING");
  if (text == nullptr || *text == '\0') return std::chrono::seconds(60);
  if (std::string_view(text) == "off") return Milliseconds(0);
  return parse_duration("LOOM_COMM_STALL_WARNING", text, "; or off");
}

bool debug_collectives_enabled() {
  return loom::detail::env_switch("LOOM_DEBUG_COLLECTIVES").value_or(false);
}

Communicator::Communicator(std::string name, int rank, int size, std::vector<int> world_ranks)
    : name_(std::move(name)),
      rank_(rank),
      size_(size),
      world_ranks_(std::move(world_ranks)),
      timeout_(default_comm_timeout()),
      stall_warning_(default_comm_stall_warning()),
      debug_(debug_collectives_enabled()),
      recorder_(std::make_shared<FlightRecorder>(FlightRecorder::default_capacity())),
      p2p_send_seq_(static_cast<size_t>(size), 0),
      p2p_recv_seq_(static_cast<size_t>(size), 0) {
  LOOM_ASSERT(size_ >= 1 && rank_ >= 0 && rank_ < size_, "rank ", rank_, " of size ", size_);
  LOOM_ASSERT(world_ranks_.size() == static_cast<size_t>(size_));
}

Communicator::~Communicator() = default;

std::string Communicator::describe_rank(int group_rank) const {
  if (group_rank < 0 || group_rank >= size_) return str_cat("rank ", group_rank);
  const int world = world_ranks_[static_cast<size_t>(group_rank)];
  return world == group_rank ? str_cat("rank ", group_rank)
                             : str_cat("rank ", group_rank, " (world rank ", world, ")");
}

// ---- checks -------------------------------------------------------------------------------------

void Communicator::check_reduce_op(ReduceOp op, DType dtype, const char* what) const {
  LOOM_CHECK(op != ReduceOp::avg || is_floating(dtype), what, " on group '", name_,
             "': avg needs a floating-point dtype, not ", dtype, " (use sum and divide)");
}

void Communicator::check_same_device_dtype(const Tensor& a, const Tensor& b,
                                           const char* what) const {
  LOOM_CHECK(a.defined() && b.defined(), what, " on group '", name_, "': tensor is undefined");
  LOOM_CHECK(a.dtype() == b.dtype() && a.device() == b.device(), what, " on group '", name_,
             "': input ", a.str(), " and output ", b.str(), " must have the same dtype and device");
  check_tensor_support(a, what);
}

std::vector<int64_t> Communicator::resolve_counts(const std::vector<int64_t>& counts, int64_t total,
                                                  const char* what, const char* total_name) const {
  if (counts.empty()) {
    LOOM_CHECK(total % size_ == 0, what, " on group '", name_, "': ", total_name, " of ", total,
               " elements does not split into ", size_,
               " equal chunks; pass per-rank counts for uneven chunks");
    return std::vector<int64_t>(static_cast<size_t>(size_), total / size_);
  }
  LOOM_CHECK(counts.size() == static_cast<size_t>(size_), what, " on group '", name_,
             "': ", counts.size(), " counts given for ", size_, " ranks");
  int64_t sum = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    LOOM_CHECK(counts[i] >= 0, what, " on group '", name_, "': count ", counts[i], " of rank ", i,
               " is negative");
    sum += counts[i];
  }
  LOOM_CHECK(sum == total, what, " on group '", name_, "': counts add up to ", sum, " but ",
             total_name, " has ", total, " elements");
  return counts;
}

void Communicator::check_peer(int peer, const char* what) const {
  LOOM_CHECK(peer >= 0 && peer < size_ && peer != rank_, what, " on group '", name_, "': peer ",
             peer, " must be another rank of the group, in [0, ", size_, ") and not ", rank_);
}

void Communicator::check_point_to_point(const Tensor& tensor, int peer, int tag,
                                        const char* what) const {
  LOOM_CHECK(tensor.defined(), what, " on group '", name_, "': tensor is undefined");
  check_tensor_support(tensor, what);
  check_peer(peer, what);
  LOOM_CHECK(tag >= 0 && tag < (1 << 15), what, " on group '", name_, "': tag ", tag,
             " must be in [0, 32768)");
}

void Communicator::check_root(int root, const char* what) const {
  LOOM_CHECK(root >= 0 && root < size_, what, " on group '", name_, "': root ", root,
             " is not a rank of the group [0, ", size_, ")");
}

// ---- issuing ------------------------------------------------------------------------------------

OpInfo Communicator::collective_info(OpType op, const Tensor* tensor, int peer,
                                     ReduceOp reduce_op) {
  OpInfo info;
  info.group = name_;
  info.op = op;
  info.peer = peer;
  info.reduce_op = reduce_op;
  if (tensor) {
    info.dtype = tensor->dtype();
    info.count = tensor->numel();
    info.bytes = tensor->nbytes();
  }
  return info;
}

detail::WorkPtr Communicator::begin(OpInfo info, std::optional<Milliseconds> timeout,
                                    std::span<const int64_t> counts,
                                    std::span<const int64_t> recv_counts) {
  if (aborted_) throw abort_error();
  const bool p2p = info.op == OpType::send || info.op == OpType::recv;
  {
    std::lock_guard lock(mutex_);
    if (p2p) {
      auto& counters = info.op == OpType::send ? p2p_send_seq_ : p2p_recv_seq_;
      info.seq = ++counters[static_cast<size_t>(info.peer)];
    } else {
      info.seq = ++collective_seq_;
    }
  }
  // Cross-check before anything is posted, so a mismatch cannot corrupt data.
  if (debug_ && !p2p) cross_check(info, timeout.value_or(timeout_), counts, recv_counts);
  auto work = std::make_shared<detail::WorkState>(std::move(info), timeout.value_or(timeout_),
                                                  weak_from_this(), recorder_);
  work->set_stall_warning(stall_warning_);
  bool departures = false;
  {
    std::lock_guard lock(mutex_);
    std::erase_if(pending_, [](const std::weak_ptr<detail::WorkState>& w) {
      const auto state = w.lock();
      return !state || state->done();
    });
    pending_.push_back(work);
    departures = !departed_.empty();
  }
  // NOTE [departing rank]: an operation a departed rank will never take part
  // in fails now (the abort fails it), and the backend does not start it.
  if (departures) check_departures();
  return work;
}

Work Communicator::all_reduce(const Tensor& tensor, const AllReduceOptions& options) {
  LOOM_CHECK(tensor.defined(), "all_reduce on group '", name_, "': tensor is undefined");
  check_tensor_support(tensor, "all_reduce");
  check_reduce_op(options.op, tensor.dtype(), "all_reduce");
  OpInfo info = collective_info(OpType::all_reduce, &tensor, -1, options.op);
  info.overlaps_compute = options.overlaps_compute;
  info.symmetric = in_symmetric_memory(tensor);
  auto work = begin(std::move(info), options.timeout);
  start_all_reduce(tensor, options, work);
  return Work(work);
}

Tensor Communicator::allocate_symmetric(const Shape& shape, DType dtype, Device device) {
  for (const int64_t d : shape) {
    LOOM_CHECK(d >= 0, "allocate_symmetric on group '", name_, "': shape ", shape_str(shape),
               " has a negative dimension");
  }
  if (!device.is_cpu()) return Tensor::zeros(shape, dtype, device);
  LOOM_CHECK(!aborted(), "allocate_symmetric on group '", name_, "': the group was aborted");
  return make_symmetric(shape, dtype);
}

Tensor Communicator::make_symmetric(const Shape& shape, DType dtype) {
  return Tensor::zeros(shape, dtype);
}

bool Communicator::in_symmetric_memory(const Tensor&) const {
  return false;
}

Work Communicator::reduce_scatter(const Tensor& input, const Tensor& output,
                                  const ReduceScatterOptions& options) {
  check_same_device_dtype(input, output, "reduce_scatter");
  check_reduce_op(options.op, input.dtype(), "reduce_scatter");
  const std::vector<int64_t> counts =
      resolve_counts(options.counts, input.numel(), "reduce_scatter", "input");
  LOOM_CHECK(output.numel() == counts[static_cast<size_t>(rank_)], "reduce_scatter on group '",
             name_, "': output ", output.str(), " of rank ", rank_, " must hold its chunk of ",
             counts[static_cast<size_t>(rank_)], " elements");
  OpInfo info = collective_info(OpType::reduce_scatter, &input, -1, options.op);
  info.overlaps_compute = options.overlaps_compute;
  auto work = begin(std::move(info), options.timeout, counts);
  ReduceScatterOptions resolved = options;
  resolved.counts = counts;
  start_reduce_scatter(input, output, resolved, work);
  return Work(work);
}

Work Communicator::all_gather(const Tensor& input, const Tensor& output,
                              const AllGatherOptions& options) {
  check_same_device_dtype(input, output, "all_gather");
  const std::vector<int64_t> counts =
      resolve_counts(options.counts, output.numel(), "all_gather", "output");
  LOOM_CHECK(input.numel() == counts[static_cast<size_t>(rank_)], "all_gather on group '", name_,
             "': input ", input.str(), " of rank ", rank_, " must hold its chunk of ",
             counts[static_cast<size_t>(rank_)], " elements");
  auto work = begin(collective_info(OpType::all_gather, &input), options.timeout, counts);
  start_all_gather(input, output, counts, work);
  return Work(work);
}

Work Communicator::broadcast(const Tensor& tensor, const BroadcastOptions& options) {
  LOOM_CHECK(tensor.defined(), "broadcast on group '", name_, "': tensor is undefined");
  check_tensor_support(tensor, "broadcast");
  check_root(options.root, "broadcast");
  auto work = begin(collective_info(OpType::broadcast, &tensor, options.root), options.timeout);
  start_broadcast(tensor, options.root, work);
  return Work(work);
}

Work Communicator::reduce(const Tensor& tensor, const ReduceOptions& options) {
  LOOM_CHECK(tensor.defined(), "reduce on group '", name_, "': tensor is undefined");
  check_tensor_support(tensor, "reduce");
  check_root(options.root, "reduce");
  check_reduce_op(options.op, tensor.dtype(), "reduce");
  auto work =
      begin(collective_info(OpType::reduce, &tensor, options.root, options.op), options.timeout);
  start_reduce(tensor, options.op, options.root, work);
  return Work(work);
}

Work Communicator::all_to_all(const Tensor& input, const Tensor& output,
                              const AllToAllOptions& options) {
  check_same_device_dtype(input, output, "all_to_all");
  const std::vector<int64_t> send =
      resolve_counts(options.send_counts, input.numel(), "all_to_all", "input");
  const std::vector<int64_t> recv =
      resolve_counts(options.recv_counts, output.numel(), "all_to_all", "output");
  auto work = begin(collective_info(OpType::all_to_all, &input), options.timeout, send, recv);
  start_all_to_all(input, output, send, recv, work);
  return Work(work);
}

Work Communicator::barrier(const BarrierOptions& options) {
  auto work = begin(collective_info(OpType::barrier, nullptr), options.timeout);
  start_barrier(work);
  return Work(work);
}

Work Communicator::send(const Tensor& tensor, int peer, const SendOptions& options) {
  check_point_to_point(tensor, peer, options.tag, "send");
  auto work = begin(collective_info(OpType::send, &tensor, peer), options.timeout);
  start_send(tensor, peer, options.tag, work);
  return Work(work);
}

Work Communicator::recv(const Tensor& tensor, int peer, const RecvOptions& options) {
  check_point_to_point(tensor, peer, options.tag, "recv");
  auto work = begin(collective_info(OpType::recv, &tensor, peer), options.timeout);
  start_recv(tensor, peer, options.tag, work);
  return Work(work);
}

std::vector<uint64_t> Communicator::p2p_issued(OpType op) const {
  LOOM_ASSERT(op == OpType::send || op == OpType::recv, "p2p_issued of ", op_type_name(op));
  std::lock_guard lock(mutex_);
  return op == OpType::send ? p2p_send_seq_ : p2p_recv_seq_;
}

uint64_t Communicator::collectives_issued() const {
  std::lock_guard lock(mutex_);
  return collective_seq_;
}

std::optional<OpInfo> Communicator::issued_collective(uint64_t seq) const {
  return recorder_->find_collective(seq);
}

void Communicator::peer_departed(int rank, const Departure& departure) {
  {
    std::lock_guard lock(mutex_);
    departed_.emplace_back(rank, departure);
  }
  check_departures();
}

void Communicator::forget_departures() {
  std::lock_guard lock(mutex_);
  departed_.clear();
}

bool Communicator::abort_if_unwinding() {
  if (std::uncaught_exceptions() == 0) return false;
  abort(str_cat(describe_rank(rank_), " failed: an exception left the scope that held group '",
                name_, "' (that rank's log names it)"));
  return true;
}

void Communicator::check_departures() {
  std::vector<std::pair<int, Departure>> departed;
  std::vector<uint64_t> sends, receives;
  {
    std::lock_guard lock(mutex_);
    if (departed_.empty() || aborted_) return;
    departed = departed_;
    sends = p2p_send_seq_;
    receives = p2p_recv_seq_;
  }
  const uint64_t issued = collectives_issued();
  const uint64_t splits = splits_issued();
  for (const auto& [rank, d] : departed) {
    const std::string who =
        str_cat(describe_rank(rank), " left the group (its program ended, or it let the group go)");
    const auto r = static_cast<size_t>(rank);
    std::string reason;
    if (issued > d.last_collective) {
      const std::optional<OpInfo> next = issued_collective(d.last_collective + 1);
      reason = str_cat(
          who, " after its collective #", d.last_collective, ", and this rank has issued #",
          d.last_collective + 1, next ? str_cat(" (", op_type_name(next->op), ")") : std::string(),
          ", which it will never join. The ranks ran different numbers of collectives: if one "
          "ran out of data first, parallel::UnevenInputs keeps them in step "
          "(docs/data_parallel.md)");
    } else if (splits > d.splits) {
      reason = str_cat(who, " after calling ", d.splits, " split(s) of it, and this rank has ",
                       "called split #", d.splits + 1, ", which it will never join");
    } else if (receives[r] > d.sent_to_me) {
      reason = str_cat(who, " after sending this rank ", d.sent_to_me,
                       " message(s), and this rank has posted receive #", d.sent_to_me + 1,
                       " from it, which nothing will ever match. The ranks ran different "
                       "numbers of steps, or their sends and receives differ");
    } else if (sends[r] > d.received_from_me) {
      reason = str_cat(who, " after posting ", d.received_from_me,
                       " receive(s) from this rank, and this rank has posted send #",
                       d.received_from_me + 1,
                       " to it, which it will never receive. The ranks ran different numbers "
                       "of steps, or their sends and receives differ");
    }
    if (!reason.empty()) {
      abort(reason);
      return;
    }
  }
}

std::shared_ptr<Communicator> Communicator::split(int color, int key, const std::string& name) {
  if (aborted_) throw abort_error();
  LOOM_CHECK(!name.empty(), "split of group '", name_, "': the new group needs a name");
  return do_split(color, key, name);
}

// ---- failure ------------------------------------------------------------------------------------

CommError Communicator::abort_error() const {
  std::string reason;
  {
    std::lock_guard lock(mutex_);
    reason = abort_reason_;
  }
  return CommError(CommError::Kind::aborted, str_cat("group '", name_, "' was aborted: ", reason));
}

void Communicator::fail_pending(const CommError& error) {
  std::vector<std::shared_ptr<detail::WorkState>> pending;
  {
    std::lock_guard lock(mutex_);
    for (const auto& w : pending_) {
      if (auto state = w.lock()) pending.push_back(std::move(state));
    }
    pending_.clear();
  }
  for (const auto& state : pending) state->fail(error);
}

void Communicator::abort(const std::string& reason) {
  std::function<void(const std::string&)> layered_abort;
  {
    std::lock_guard lock(mutex_);
    if (aborted_) return;
    abort_reason_ = reason;
    aborted_ = true;
    layered_abort = std::move(layered_abort_);
  }
  LOOM_LOG_ERROR("aborting group '", name_, "': ", reason);
  fail_pending(CommError(CommError::Kind::peer_failed,
                         str_cat("group '", name_, "' was aborted: ", reason)));
  try {
    notify_peers_of_abort(reason);
  } catch (const std::exception& e) {
    LOOM_LOG_WARN("could not tell the peers of group '", name_, "' about the abort: ", e.what());
  }
  if (layered_abort) layered_abort(reason);
}

void Communicator::set_layered_abort(std::function<void(const std::string&)> on_abort) {
  std::lock_guard lock(mutex_);
  layered_abort_ = std::move(on_abort);
}

void Communicator::layered_issued() {
  bool departures = false;
  {
    std::lock_guard lock(mutex_);
    departures = !departed_.empty();
  }
  if (departures) check_departures();
}

std::string Communicator::dump_flight_recorder() const {
  const std::string text =
      recorder_->dump(str_cat("flight recorder of group '", name_, "' on ", describe_rank(rank_)));
  LOOM_LOG_WARN(text);
  return text;
}

// NOTE [timeout diagnosis]
// A collective that did not complete in time asks every peer (peer_progress():
// on the mpi backend a status query over the control channel, sent only now,
// so the normal path pays nothing) the number of the last collective it has
// issued and what its collective of the timed-out number was. Each rank is then
//   did not answer               dead, or stuck outside Loom (a stopped process);
//   behind                       "has not called it (its last collective is #k)";
//   at or past the number        its call of that number is compared with this
//                                rank's (cross_check.hpp): ranks that called
//                                different collectives, or one with a different
//                                count or dtype, are named with what each is in,
//                                "rank 0 is in all_reduce #12 of 1048576 f32,
//                                rank 1 in barrier #12" -- MPI cannot match such
//                                calls, so the transport waits forever.
// Only when every rank answered, has called it and called the same thing is the
// transport itself stuck. A peer that cannot say what its call was (the local
// and nccl backends, a flight recorder that is off or has dropped it) counts as
// agreeing.
std::pair<std::string, std::vector<int>> Communicator::diagnose_wait(const OpInfo& info) {
  std::vector<int> missing;
  const bool p2p = info.op == OpType::send || info.op == OpType::recv;
  if (p2p) {
    missing.push_back(info.peer);
    return {str_cat(": ", describe_rank(info.peer), " has not posted the matching ",
                    info.op == OpType::send ? "recv" : "send", " (or is stuck or dead)"),
            missing};
  }
  const auto progress = peer_progress(info.seq);
  if (!progress) {
    return {str_cat(" (backend '", backend(), "' cannot tell which ranks have not arrived)"),
            missing};
  }
  std::vector<std::string> parts;
  std::vector<std::optional<OpInfo>> calls(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    const std::optional<PeerProgress>& peer = (*progress)[static_cast<size_t>(r)];
    if (r == rank_) {
      calls[static_cast<size_t>(r)] = info;
    } else if (!peer) {
      missing.push_back(r);
      parts.push_back(str_cat(describe_rank(r), " did not answer (dead, or stuck outside Loom)"));
    } else if (peer->last_collective < info.seq) {
      missing.push_back(r);
      parts.push_back(str_cat(describe_rank(r), " has not called it (its last collective is #",
                              peer->last_collective, ")"));
    } else {
      calls[static_cast<size_t>(r)] = peer->call;
    }
  }
  if (const std::string disagreement = detail::collective_disagreement(calls);
      !disagreement.empty()) {
    parts.push_back(str_cat(disagreement,
                            " (every rank must issue the same collectives in the same order; "
                            "LOOM_DEBUG_COLLECTIVES=1 compares each call before any data "
                            "moves, to find the first that differs)"));
  }
  if (parts.empty()) return {": every rank has called it; the transport itself is stuck", missing};
  std::string text = ": ";
  for (size_t i = 0; i < parts.size(); ++i) text += (i ? "; " : "") + parts[i];
  return {text, missing};
}

void Communicator::handle_timeout(detail::WorkState& work, Milliseconds waited) {
  const OpInfo& info = work.info();
  const auto [why, missing] = diagnose_wait(info);
  const std::string message = str_cat(info.describe(), " did not complete within ",
                                      waited.count() / 1000.0, " s on ", describe_rank(rank_), why);
  LOOM_LOG_ERROR(message);
  dump_flight_recorder();
  abort(message);
  throw CommError(CommError::Kind::timeout, message, missing);
}

// NOTE [stall warning]
// The timeout that ends a hung job is long (ten minutes by default, like
// PyTorch's watchdog), since a slow rank is not a dead one. Waiting that long
// with nothing said is what users of those runtimes complain about, so a wait
// that has gone on for LOOM_COMM_STALL_WARNING (default 60 s, Horovod's stall
// inspector's figure) logs a warning with the same diagnosis a timeout gives
// -- which ranks have not called the collective, which did not answer, which
// called another one -- and waits on. It is what one looks at to attach a
// debugger to the right rank while the job still runs. Once per wait() call;
// it costs nothing before then (the status queries are sent only now).
std::string Communicator::report_stall(const detail::WorkState& work, Milliseconds waited,
                                       Milliseconds limit) {
  const OpInfo& info = work.info();
  const std::string message = str_cat(
      info.describe(), " has waited ", waited.count() / 1000.0, " s on ", describe_rank(rank_),
      diagnose_wait(info).first, "; waiting on, up to ", limit.count() / 1000.0,
      " s in all (LOOM_COMM_TIMEOUT; this warning comes after ", "LOOM_COMM_STALL_WARNING)");
  LOOM_LOG_WARN(message);
  return message;
}

// ---- default backend hooks ----------------------------------------------------------------------

namespace {
[[noreturn]] void unsupported(std::string_view backend, const char* op) {
  throw Error(str_cat("backend '", backend, "' does not support ", op));
}
}  // namespace

void Communicator::start_all_reduce(const Tensor&, const AllReduceOptions&,
                                    const detail::WorkPtr&) {
  unsupported(backend(), "all_reduce");
}
void Communicator::start_reduce_scatter(const Tensor&, const Tensor&, const ReduceScatterOptions&,
                                        const detail::WorkPtr&) {
  unsupported(backend(), "reduce_scatter");
}
void Communicator::start_all_gather(const Tensor&, const Tensor&, const std::vector<int64_t>&,
                                    const detail::WorkPtr&) {
  unsupported(backend(), "all_gather");
}
void Communicator::start_broadcast(const Tensor&, int, const detail::WorkPtr&) {
  unsupported(backend(), "broadcast");
}
void Communicator::start_reduce(const Tensor&, ReduceOp, int, const detail::WorkPtr&) {
  unsupported(backend(), "reduce");
}
void Communicator::start_all_to_all(const Tensor&, const Tensor&, const std::vector<int64_t>&,
                                    const std::vector<int64_t>&, const detail::WorkPtr&) {
  unsupported(backend(), "all_to_all");
}
void Communicator::start_barrier(const detail::WorkPtr&) {
  unsupported(backend(), "barrier");
}
void Communicator::start_send(const Tensor&, int, int, const detail::WorkPtr&) {
  unsupported(backend(), "send");
}
void Communicator::start_recv(const Tensor&, int, int, const detail::WorkPtr&) {
  unsupported(backend(), "recv");
}
std::shared_ptr<Communicator> Communicator::do_split(int, int, const std::string&) {
  unsupported(backend(), "split");
}
void Communicator::cross_check(const OpInfo&, Milliseconds, std::span<const int64_t>,
                               std::span<const int64_t>) {}
std::optional<std::vector<std::optional<Communicator::PeerProgress>>> Communicator::peer_progress(
    uint64_t) {
  return std::nullopt;
}
void Communicator::report_layered_progress(std::shared_ptr<const std::atomic<uint64_t>>) {}
void Communicator::notify_peers_of_abort(const std::string&) {}

}  // namespace loom::comm
