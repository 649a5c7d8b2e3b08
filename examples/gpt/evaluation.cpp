#include "evaluation.hpp"

#include <cmath>
#include <cstring>
#include <vector>

namespace loom::examples {
namespace {

namespace pl = loom::parallel::pipeline;

// Sends in flight, with the tensors they read.
struct Outgoing {
  std::vector<loom::Tensor> tensors;
  std::vector<loom::comm::Work> works;
  void wait() {
    for (loom::comm::Work& w : works) w.wait();
    works.clear();
    tensors.clear();
  }
};

// One tensor to `peer` of the pp group: a shape header (dtype, rank, up to 6
// dimensions), then the payload. The evaluation's batches may differ in shape
// from the training's, so nothing is cached.
void send_to_stage(loom::comm::Communicator& pp, const loom::Tensor& x, int peer, Outgoing& out) {
  LOOM_CHECK(x.dim() <= 6, "pipeline evaluation: an activation of ", x.dim(),
             " dimensions does not fit the 6 of the shape header");
  std::vector<int64_t> header(8, 0);
  header[0] = static_cast<int64_t>(x.dtype());
  header[1] = x.dim();
  for (int64_t d = 0; d < x.dim(); ++d) {
    header[static_cast<size_t>(2 + d)] = x.shape()[static_cast<size_t>(d)];
  }
  out.tensors.push_back(loom::Tensor::from_vector(header, {8}));
  out.works.push_back(pp.send(out.tensors.back(), peer, {.tag = kEvalShapeTag}));
  out.tensors.push_back(x);
  out.works.push_back(pp.send(x, peer, {.tag = kEvalPayloadTag}));
}

loom::Tensor recv_from_stage(loom::comm::Communicator& pp, int peer, loom::Device device) {
  loom::Tensor header = loom::Tensor::zeros({8}, loom::DType::i64);
  pp.recv(header, peer, {.tag = kEvalShapeTag}).wait();
  const std::vector<int64_t> h = header.to_vector<int64_t>();
  const loom::Shape shape(h.begin() + 2, h.begin() + 2 + h[1]);
  loom::Tensor x = loom::Tensor::empty(shape, static_cast<loom::DType>(h[0]), device);
  pp.recv(x, peer, {.tag = kEvalPayloadTag}).wait();
  return x;
}

// Validation loss under pipeline parallelism: each global batch's rows of this
// replica go forward only, whole (no micro-batches), through the chunks in
// dataflow order, each chunk on the rank the schedule places it; the rank
// holding the last chunk computes the loss. Returns the mean over the batches
}  // namespace

// Validation loss over `max_batches` global batches, each rank taking its rows.
double evaluate(loom::nn::Module& model, Loss& loss_fn,
                const std::shared_ptr<const loom::data::TokenFile>& file,
                const loom::data::TokenLoaderOptions& options, int64_t max_batches,
                loom::Device device, loom::comm::Communicator& dp) {
  model.set_training(false);
  loom::data::TokenValidationBatches batches(file, options, max_batches);
  loom::data::TokenBatch batch;
  double total = 0;
  int64_t count = 0;
  while (batches.next(batch)) {
    loom::nn::Tape tape, loss_tape;
    loom::Tensor logits = model.forward(batch.inputs.to(device), tape);
    total += loss_fn.forward(logits, batch.targets.to(device), loss_tape).item<float>();
    ++count;
  }
  model.set_training(true);
  return parallel::mean_over(dp, count > 0 ? total / static_cast<double>(count) : std::nan(""));
}

// and the dp replicas, on every rank.
double pipeline_evaluate(const pl::Schedule& schedule, const pl::GPTChunks& chunks, Loss& loss_fn,
                         const std::shared_ptr<const loom::data::TokenFile>& file,
                         const loom::data::TokenLoaderOptions& options, int64_t max_batches,
                         loom::Device device, loom::comm::Communicator& pp,
                         loom::comm::Communicator& dp) {
  using namespace loom;
  for (nn::Module* chunk : chunks.modules()) chunk->set_training(false);
  const int me = pp.rank();
  const int last = schedule.chunks() - 1;
  data::TokenValidationBatches batches(file, options, max_batches);
  data::TokenBatch batch;
  double total = 0;
  int64_t count = 0;
  while (batches.next(batch)) {
    Outgoing sends;
    Tensor x;  // the activation that enters the next chunk this rank runs
    for (int c = 0; c <= last; ++c) {
      if (schedule.rank_of(c) != me) continue;
      if (c == 0) {
        x = batch.inputs.to(device);
      } else if (schedule.rank_of(c - 1) != me) {
        x = recv_from_stage(pp, schedule.rank_of(c - 1), device);
      }
      nn::Tape tape;
      x = chunks
              .parts[static_cast<size_t>(schedule.placement[static_cast<size_t>(c)].virtual_stage)]
              ->forward(x, tape);
      if (c == last) {
        nn::Tape loss_tape;
        total += loss_fn.forward(x, batch.targets.to(device), loss_tape).item<float>();
        ++count;
      } else if (schedule.rank_of(c + 1) != me) {
        send_to_stage(pp, x, schedule.rank_of(c + 1), sends);
      }
    }
    sends.wait();
  }
  for (nn::Module* chunk : chunks.modules()) chunk->set_training(true);
  // The double's bits from the last chunk's rank, then the mean over replicas.
  double mean = count > 0 ? total / static_cast<double>(count) : std::nan("");
  int64_t bits = 0;
  std::memcpy(&bits, &mean, sizeof bits);
  Tensor shared = Tensor::from_vector(std::vector<int64_t>{bits}, {1});
  pp.broadcast(shared, {.root = schedule.rank_of(last)}).wait();
  bits = shared.item<int64_t>();
  std::memcpy(&mean, &bits, sizeof bits);
  return parallel::mean_over(dp, mean);
}

}  // namespace loom::examples
