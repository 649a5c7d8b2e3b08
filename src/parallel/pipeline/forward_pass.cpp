#include "loom/parallel/pipeline/forward_pass.hpp"

#include <cstring>

#include "loom/core/error.hpp"
#include "loom/nn/tape.hpp"

namespace loom::parallel::pipeline {

namespace {

constexpr int64_t kMaxDims = 6;

// Sends in flight, with the tensors they read.
struct Outgoing {
  std::vector<Tensor> tensors;
  std::vector<comm::Work> works;
  void wait() {
    for (comm::Work& w : works) w.wait();
    works.clear();
    tensors.clear();
  }
};

void send_to_stage(comm::Communicator& pp, const Tensor& x, int peer, Outgoing& out) {
  LOOM_CHECK(x.dim() <= kMaxDims, "pipeline forward pass: an activation of ", x.dim(),
             " dimensions does not fit the ", kMaxDims, " of the shape header");
  std::vector<int64_t> header(2 + kMaxDims, 0);
  header[0] = static_cast<int64_t>(x.dtype());
  header[1] = x.dim();
  for (int64_t d = 0; d < x.dim(); ++d) {
    header[static_cast<size_t>(2 + d)] = x.shape()[static_cast<size_t>(d)];
  }
  out.tensors.push_back(Tensor::from_vector(header, {2 + kMaxDims}));
  out.works.push_back(pp.send(out.tensors.back(), peer, {.tag = kForwardPassShapeTag}));
  out.tensors.push_back(x);
  out.works.push_back(pp.send(x, peer, {.tag = kForwardPassPayloadTag}));
}

Tensor recv_from_stage(comm::Communicator& pp, int peer, Device device) {
  Tensor header = Tensor::zeros({2 + kMaxDims}, DType::i64);
  pp.recv(header, peer, {.tag = kForwardPassShapeTag}).wait();
  const std::vector<int64_t> h = header.to_vector<int64_t>();
  LOOM_CHECK(h[1] >= 0 && h[1] <= kMaxDims, "pipeline forward pass: rank ", peer,
             " announced an activation of ", h[1], " dimensions");
  const Shape shape(h.begin() + 2, h.begin() + 2 + h[1]);
  Tensor x = Tensor::empty(shape, static_cast<DType>(h[0]), device);
  pp.recv(x, peer, {.tag = kForwardPassPayloadTag}).wait();
  return x;
}

}  // namespace

Tensor forward_through_stages(const Schedule& schedule, comm::Communicator& pp,
                              const std::vector<nn::Module*>& chunks, const Tensor& input,
                              Device device) {
  LOOM_CHECK(static_cast<int>(chunks.size()) == schedule.virtual_stages,
             "pipeline forward pass: ", chunks.size(), " chunk modules for the ",
             schedule.virtual_stages, " virtual stage(s) of schedule '", schedule.name, "'");
  const RunChunk run = [&](int stage, const Tensor& x) {
    nn::Tape tape;
    return chunks[static_cast<size_t>(stage)]->forward(x, tape);
  };
  return forward_through_stages(schedule, pp, run, input, device);
}

Tensor forward_through_stages(const Schedule& schedule, comm::Communicator& pp,
                              const RunChunk& run_chunk, const Tensor& input, Device device) {
  LOOM_CHECK(pp.size() == schedule.pp, "pipeline forward pass: a pp group of ", pp.size(),
             " ranks runs schedule '", schedule.name, "' of pp ", schedule.pp);
  const int me = pp.rank();
  const int last = schedule.chunks() - 1;
  Outgoing sends;
  Tensor x;  // the activation entering the next chunk this rank runs
  Tensor out;
  for (int c = 0; c <= last; ++c) {
    if (schedule.rank_of(c) != me) continue;
    if (c == 0) {
      x = input;
    } else if (schedule.rank_of(c - 1) != me) {
      x = recv_from_stage(pp, schedule.rank_of(c - 1), device);
    }
    x = run_chunk(schedule.placement[static_cast<size_t>(c)].virtual_stage, x);
    if (c == last) {
      out = x;
    } else if (schedule.rank_of(c + 1) != me) {
      send_to_stage(pp, x, schedule.rank_of(c + 1), sends);
    }
  }
  sends.wait();
  return out;
}

double broadcast_double(comm::Communicator& group, double value, int root) {
  int64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  Tensor shared = Tensor::from_vector(std::vector<int64_t>{bits}, {1});
  group.broadcast(shared, {.root = root}).wait();
  bits = shared.item<int64_t>();
  std::memcpy(&value, &bits, sizeof bits);
  return value;
}

}  // namespace loom::parallel::pipeline
