#include "stage_messages.hpp"

#include <algorithm>

#include "loom/core/error.hpp"

namespace loom::parallel::pipeline::detail {
namespace {

// int64 [dtype, ndim, d0, ..., d7]
constexpr int64_t kMaxHeaderDims = 8;
constexpr int64_t kHeaderElements = 2 + kMaxHeaderDims;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

const char* kind_name(MessageKind kind) {
  return kind == MessageKind::activation ? "activation" : "gradient";
}

std::string shape_str(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += str_cat(i ? ", " : "", shape[i]);
  return out + "]";
}

}  // namespace

int payload_tag(MessageKind kind, int micro_batch, int chunk, int chunks, int micro_batches) {
  return 2 * chunks + 2 * (chunk * micro_batches + micro_batch) + static_cast<int>(kind);
}

int shape_tag(MessageKind kind, int chunk) {
  return 2 * chunk + static_cast<int>(kind);
}

int max_message_tag(int chunks, int micro_batches) {
  return payload_tag(MessageKind::gradient, micro_batches - 1, chunks - 1, chunks, micro_batches);
}

StageMessages::StageMessages(comm::Communicator& pp, int chunks, int micro_batches, Device device)
    : pp_(pp), chunks_(chunks), micro_batches_(micro_batches), device_(device) {}

int StageMessages::tag_of(const Key& key) const {
  return payload_tag(key.kind, key.micro_batch, key.chunk, chunks_, micro_batches_);
}

std::string StageMessages::describe(const Key& key, int peer, bool send) {
  return str_cat(kind_name(key.kind), " of micro-batch ", key.micro_batch, " chunk ", key.chunk,
                 send ? " to rank " : " from rank ", peer);
}

void StageMessages::send(MessageKind kind, int micro_batch, int chunk, int peer,
                         const Tensor& tensor) {
  const Key key{kind, micro_batch, chunk};
  LOOM_CHECK(tensor.defined(), "pipeline send of ", describe(key, peer, true),
             ": the tensor is undefined");
  const auto layout_key = std::make_pair(kind, chunk);
  auto it = sent_layouts_.find(layout_key);
  if (it == sent_layouts_.end()) {
    LOOM_CHECK(tensor.dim() <= kMaxHeaderDims, "pipeline send of ", describe(key, peer, true), ": ",
               tensor.dim(), " dimensions, more than the ", kMaxHeaderDims,
               " a shape header carries");
    std::vector<int64_t> header(kHeaderElements, 0);
    header[0] = static_cast<int64_t>(tensor.dtype());
    header[1] = tensor.dim();
    for (int64_t d = 0; d < tensor.dim(); ++d) header[static_cast<size_t>(2 + d)] = tensor.size(d);
    Tensor h = Tensor::from_vector(header, {kHeaderElements});
    sends_.push_back({pp_.send(h, peer, {.tag = shape_tag(kind, chunk)}), h});
    it = sent_layouts_.emplace(layout_key, Layout{tensor.shape(), tensor.dtype()}).first;
  } else {
    LOOM_CHECK(tensor.shape() == it->second.shape && tensor.dtype() == it->second.dtype,
               "pipeline send of ", describe(key, peer, true), ": the tensor is ", tensor.str(),
               " but the first ", kind_name(kind), " of chunk ", chunk, " announced ",
               shape_str(it->second.shape), " ", dtype_name(it->second.dtype),
               "; shapes are exchanged once and must stay the same for every micro-batch "
               "and step");
  }
  sends_.push_back({pp_.send(tensor, peer, {.tag = tag_of(key)}), tensor});
  ++messages_sent_;
  bytes_sent_ += static_cast<int64_t>(tensor.nbytes());
}

void StageMessages::reap_sends() {
  while (!sends_.empty() && sends_.front().work.is_completed()) {
    sends_.front().work.wait();  // rethrows a failure
    sends_.pop_front();
  }
}

double StageMessages::wait_sends() {
  const auto start = std::chrono::steady_clock::now();
  while (!sends_.empty()) {
    sends_.front().work.wait();
    sends_.pop_front();
  }
  return seconds_since(start);
}

void StageMessages::post_payload(const Key& key, Receive& receive) {
  const Layout& layout = received_layouts_.at({key.kind, key.chunk});
  receive.payload = Tensor::empty(layout.shape, layout.dtype, device_);
  receive.payload_work = pp_.recv(receive.payload, receive.peer, {.tag = tag_of(key)});
}

void StageMessages::post(MessageKind kind, int micro_batch, int chunk, int peer) {
  const Key key{kind, micro_batch, chunk};
  auto [it, inserted] = receives_.try_emplace(key);
  LOOM_CHECK(inserted, "pipeline receive of ", describe(key, peer, false),
             " posted twice in one step");
  Receive& receive = it->second;
  receive.peer = peer;
  if (received_layouts_.count({kind, chunk}) != 0) {
    post_payload(key, receive);
    return;
  }
  // The first of this kind and chunk: the header is on its way, or this
  // receive carries it (NOTE [pipeline messages]).
  for (const auto& [other, pending] : receives_) {
    if (other.kind == kind && other.chunk == chunk && pending.carries_header) return;
  }
  receive.carries_header = true;
  receive.header = Tensor::empty({kHeaderElements}, DType::i64);
  receive.header_work = pp_.recv(receive.header, peer, {.tag = shape_tag(kind, chunk)});
}

Tensor StageMessages::take(MessageKind kind, int micro_batch, int chunk, int peer,
                           double& waited_seconds) {
  const Key key{kind, micro_batch, chunk};
  if (receives_.count(key) == 0) post(kind, micro_batch, chunk, peer);
  Receive& receive = receives_.at(key);
  LOOM_CHECK(receive.peer == peer, "pipeline receive of ", describe(key, peer, false),
             " was posted from rank ", receive.peer);
  const auto start = std::chrono::steady_clock::now();
  if (receive.carries_header) {
    receive.header_work.wait();
    const std::vector<int64_t> h = receive.header.to_vector<int64_t>();
    LOOM_CHECK(h[0] >= 0 && h[0] <= static_cast<int64_t>(DType::i64) && h[1] >= 0 &&
                   h[1] <= kMaxHeaderDims,
               "pipeline receive of ", describe(key, peer, false),
               ": the shape header is corrupt (dtype ", h[0], ", ", h[1], " dimensions)");
    Layout layout{Shape(h.begin() + 2, h.begin() + 2 + h[1]), static_cast<DType>(h[0])};
    received_layouts_.emplace(std::make_pair(kind, chunk), layout);
    receive.carries_header = false;
    post_payload(key, receive);
    for (auto& [other, pending] : receives_) {  // the deferred ones (NOTE [pipeline messages])
      if (other.kind == kind && other.chunk == chunk && !pending.payload.defined()) {
        post_payload(other, pending);
      }
    }
  }
  LOOM_CHECK(receive.payload.defined(), "pipeline receive of ", describe(key, peer, false),
             " is taken before the receive carrying its shape");
  receive.payload_work.wait();
  waited_seconds += seconds_since(start);
  Tensor out = std::move(receive.payload);
  receives_.erase(key);
  ++messages_received_;
  return out;
}

void StageMessages::reset_counters() {
  messages_sent_ = 0;
  bytes_sent_ = 0;
  messages_received_ = 0;
}

}  // namespace loom::parallel::pipeline::detail
