#include "ddp_harness.hpp"

#include <algorithm>
#include <cmath>

#include "loom/core/random.hpp"
#include "loom/nn/activation.hpp"
#include "loom/nn/batch_norm.hpp"
#include "loom/nn/conv2d.hpp"
#include "loom/nn/cross_entropy_loss.hpp"
#include "loom/nn/layer_norm.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/pool.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/parallel/sync_batch_norm.hpp"

namespace loom::testing {

namespace {

constexpr int64_t kClasses = 5;
constexpr uint64_t kModelSeed = 7;
constexpr uint64_t kDataSeed = 99;

// Input rows [begin, end) of the global batch; a pure function of the row
// index range, so the ranks' slices concatenate to the reference's batch.
Tensor inputs(ModelKind kind, int64_t begin, int64_t end) {
  const Shape row = kind == ModelKind::mlp ? Shape{8} : Shape{3, 5, 5};
  const int64_t row_numel = shape_numel(row);
  Tensor all = Tensor::empty({end * row_numel});
  fill_normal(all, RandomKey{kDataSeed, 1}, 0.0f, 1.0f);
  Shape shape = row;
  shape.insert(shape.begin(), end - begin);
  return all.flat_view(begin * row_numel, shape).clone();
}

Tensor targets(int64_t begin, int64_t end) {
  std::vector<int64_t> values;
  for (int64_t i = begin; i < end; ++i) values.push_back((i * 7 + 3) % kClasses);
  return Tensor::from_vector(values, {end - begin});
}

std::unique_ptr<optim::Optimizer> make_optimizer(OptimizerKind kind,
                                                 const std::vector<nn::Parameter*>& params) {
  if (kind == OptimizerKind::sgd) {
    return std::make_unique<optim::SGD>(optim::param_slots(params),
                                        optim::SgdOptions{.lr = 0.1, .momentum = 0.9});
  }
  return std::make_unique<optim::AdamW>(optim::param_slots(params),
                                        optim::AdamWOptions{.lr = 1e-3, .weight_decay = 0.01});
}

// Forward + backward of one micro-batch; the loss gradient is scaled by `scale`.
double forward_backward(nn::Sequential& model, const Tensor& x, const Tensor& y, float scale) {
  nn::CrossEntropyLoss ce;
  nn::Tape tape;
  const Tensor logits = model.forward(x, tape);
  const double loss = ce.forward(logits, y, tape).item<float>();
  model.backward(ce.backward(tape, scale), tape);
  return loss;
}

std::vector<std::vector<float>> values(nn::Sequential& model) {
  std::vector<std::vector<float>> out;
  for (nn::Parameter* p : model.parameters()) out.push_back(p->value().to_vector<float>());
  return out;
}

}  // namespace

std::unique_ptr<nn::Sequential> make_model(ModelKind kind, uint64_t seed) {
  const nn::ModuleOptions m{.seed = seed};
  auto model = std::make_unique<nn::Sequential>("net");
  if (kind == ModelKind::mlp) {
    model->emplace<nn::Linear>("net.fc1", 8, 16, nn::LinearOptions{.module = m});
    model->emplace<nn::GELU>("net.act");
    model->emplace<nn::LayerNorm>("net.ln", 16, 1e-5f, m);
    model->emplace<nn::Linear>("net.fc2", 16, kClasses, nn::LinearOptions{.module = m});
  } else {
    model->emplace<nn::Conv2d>("net.conv", 3, 4, 3, nn::Conv2dOptions{.padding = 1, .module = m});
    model->emplace<nn::BatchNorm2d>("net.bn", 4, nn::BatchNormOptions{.module = m});
    model->emplace<nn::ReLU>("net.relu");
    model->emplace<nn::GlobalAvgPool>("net.pool");
    model->emplace<nn::Linear>("net.fc", 4, kClasses, nn::LinearOptions{.module = m});
  }
  return model;
}

RunResult run_data_parallel(const DdpRun& run, comm::Communicator& comm) {
  auto model = make_model(run.model, comm.rank() == 0 ? kModelSeed : kModelSeed + 1 + comm.rank());
  if (run.sync_bn) parallel::sync_batch_norms(*model, comm);
  parallel::GradReducer reducer(model->parameters(), comm, run.reducer);
  auto opt = make_optimizer(run.optimizer, model->parameters());

  RunResult result;
  const int64_t n = run.per_rank_batch;
  const int64_t micro = n / run.micro_steps;
  for (int step = 0; step < run.steps; ++step) {
    opt->zero_grad();
    double loss = 0;
    for (int m = 0; m < run.micro_steps; ++m) {
      const int64_t begin = comm.rank() * n + m * micro;
      const Tensor x = inputs(run.model, begin, begin + micro);
      const Tensor y = targets(begin, begin + micro);
      const float scale = 1.0f / static_cast<float>(run.micro_steps);
      if (m + 1 < run.micro_steps) {
        auto guard = reducer.no_sync();
        loss += forward_backward(*model, x, y, scale) * scale;
      } else {
        loss += forward_backward(*model, x, y, scale) * scale;
      }
    }
    reducer.finish();
    opt->step();
    result.losses.push_back(loss);
  }
  result.params = values(*model);
  result.buckets = reducer.bucket_parameters();
  result.rebuilds = reducer.rebuild_count();
  result.stats = reducer.stats();
  return result;
}

RunResult run_single_rank(const DdpRun& run, int ranks, bool accumulate_per_rank) {
  auto model = make_model(run.model, kModelSeed);
  auto opt = make_optimizer(run.optimizer, model->parameters());
  RunResult result;
  const int64_t global = run.per_rank_batch * ranks;
  for (int step = 0; step < run.steps; ++step) {
    opt->zero_grad();
    double loss = 0;
    if (accumulate_per_rank) {
      for (int r = 0; r < ranks; ++r) {
        const int64_t begin = r * run.per_rank_batch, end = begin + run.per_rank_batch;
        const float scale = 1.0f / static_cast<float>(ranks);
        loss +=
            forward_backward(*model, inputs(run.model, begin, end), targets(begin, end), scale) *
            scale;
      }
    } else {
      loss = forward_backward(*model, inputs(run.model, 0, global), targets(0, global), 1.0f);
    }
    opt->step();
    result.losses.push_back(loss);
  }
  result.params = values(*model);
  return result;
}

}  // namespace loom::testing
