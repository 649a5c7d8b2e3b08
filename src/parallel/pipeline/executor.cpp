#include "loom/parallel/pipeline/executor.hpp"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>

#include "loom/core/error.hpp"
#include "loom/core/stream.hpp"
#include "loom/kernels/gemm.hpp"
#include "loom/parallel/mean_over.hpp"
#include "loom/parallel/pipeline/validate.hpp"
#include "loom/trace/profiler.hpp"
#include "stage_messages.hpp"

namespace loom::parallel::pipeline {

using detail::MessageKind;

namespace {

// The largest tag the communicator takes, plus one (Communicator::send).
constexpr int kTagLimit = 1 << 15;

// The micro-batch whose W (or BW) is the last on every chunk of `rank`, or a
// loom::Error naming two chunks that disagree (NOTE [final micro-batch] in
// src/parallel/grad_buckets.hpp: the bucket engine launches on that
// micro-batch's ready signals, so no other micro-batch may write a weight
// gradient of the rank after it).
int final_micro_batch_of(const Schedule& schedule, int rank) {
  std::map<int, int> last;  // chunk -> micro-batch of its last W or BW
  for (const Action& a : schedule.ranks[static_cast<size_t>(rank)]) {
    if (a.kind == ActionKind::backward_weight || a.kind == ActionKind::backward) {
      last[a.chunk] = a.micro_batch;
    }
  }
  LOOM_CHECK(!last.empty(), "pipeline executor: schedule '", schedule.name, "', rank ", rank,
             ": no weight gradient is computed on this rank");
  const auto& [first_chunk, final_micro] = *last.begin();
  for (const auto& [chunk, micro] : last) {
    LOOM_CHECK(micro == final_micro, "pipeline executor: schedule '", schedule.name, "', rank ",
               rank, ": the last weight gradient of chunk ", first_chunk, " is micro-batch ",
               final_micro, "'s but chunk ", chunk, "'s is micro-batch ", micro,
               "'s; the gradient-bucket engine needs one micro-batch whose weight gradients "
               "come last on every chunk of a rank");
  }
  return final_micro;
}

void check_inputs(const Schedule& schedule, const comm::Communicator& pp,
                  const std::vector<nn::Module*>& chunks, const ExecutorOptions& options) {
  LOOM_CHECK(pp.size() == schedule.pp, "pipeline executor: schedule '", schedule.name,
             "' is for pp ", schedule.pp, " but the pipeline group '", pp.name(), "' has ",
             pp.size(), " ranks");
  try {
    validate_schedule(schedule);
  } catch (const Error& e) {
    throw Error(
        str_cat("pipeline executor: schedule '", schedule.name, "' fails validation: ", e.what()));
  }
  LOOM_CHECK(static_cast<int>(chunks.size()) == schedule.virtual_stages,
             "pipeline executor: schedule '", schedule.name, "' places ", schedule.virtual_stages,
             " chunk(s) on each rank but rank ", pp.rank(), " was given ", chunks.size(),
             " module(s)");
  for (size_t j = 0; j < chunks.size(); ++j) {
    LOOM_CHECK(chunks[j] != nullptr, "pipeline executor: the module of virtual stage ", j,
               " on rank ", pp.rank(), " is null");
  }
  LOOM_CHECK(options.receives_ahead >= 1, "pipeline executor: receives_ahead ",
             options.receives_ahead, " must be at least 1");
  LOOM_CHECK(options.clip_grad_norm >= 0 && std::isfinite(options.clip_grad_norm),
             "pipeline executor: clip_grad_norm ", options.clip_grad_norm,
             " must be finite and >= 0 (0: no clipping)");
  LOOM_CHECK(options.packed_weight_bytes >= 0, "pipeline executor: packed_weight_bytes ",
             options.packed_weight_bytes, " must be >= 0 (0: pack weights per micro-batch)");
  const int top = detail::max_message_tag(schedule.chunks(), schedule.micro_batches);
  LOOM_CHECK(top < kTagLimit, "pipeline executor: schedule '", schedule.name, "' with ",
             schedule.chunks(), " chunks and ", schedule.micro_batches,
             " micro-batches needs message tags up to ", top, "; the communicator's end at ",
             kTagLimit - 1, " (2 x chunks x (micro-batches + 1) must stay below ", kTagLimit, ")");
  int reduces = 0, steps = 0;
  for (const Action& a : schedule.ranks[static_cast<size_t>(pp.rank())]) {
    reduces += a.kind == ActionKind::reduce_gradients;
    steps += a.kind == ActionKind::optimizer_step;
  }
  LOOM_CHECK(reduces == 1 && steps == 1, "pipeline executor: schedule '", schedule.name, "', rank ",
             pp.rank(), " has ", reduces, " reduce gradients and ", steps,
             " optimizer step actions; the executor needs exactly one of each");
}

// The device of the rank's chunks, where received activations and gradients
// are allocated: every parameter's, which must be one (the CPU when the
// chunks hold none).
Device chunks_device(const std::vector<nn::Module*>& chunks, int rank) {
  const nn::Parameter* first = nullptr;
  for (nn::Module* chunk : chunks) {
    for (const nn::Parameter* p : chunk->parameters()) {
      if (first == nullptr) first = p;
      LOOM_CHECK(p->device() == first->device(), "pipeline executor: rank ", rank,
                 " holds parameter '", first->name(), "' on ", first->device().str(), " and '",
                 p->name(), "' on ", p->device().str(),
                 "; a rank's chunks must all live on one device");
    }
  }
  return first != nullptr ? first->device() : Device::cpu();
}

double seconds_between(int64_t start_ns, int64_t end_ns) {
  return static_cast<double>(end_ns - start_ns) * 1e-9;
}

}  // namespace

struct PipelineExecutor::Impl {
  Impl(Schedule s, comm::Communicator& group, std::vector<nn::Module*> modules,
       ZeroOptimizer& optimizer, ExecutorOptions opts)
      : schedule(std::move(s)),
        pp(group),
        chunks(std::move(modules)),
        zero(optimizer),
        options(opts),
        device(chunks_device(chunks, group.rank())),
        messages(group, schedule.chunks(), schedule.micro_batches, device) {}

  Schedule schedule;
  comm::Communicator& pp;
  std::vector<nn::Module*> chunks;  // per virtual stage
  ZeroOptimizer& zero;
  ExecutorOptions options;
  Device device;  // the chunks' (chunks_device)
  detail::StageMessages messages;
  int final_micro = 0;
  bool failed = false;  // a step threw: messages may be half exchanged

  StepStats run(const InputProvider& input, const LossFunction& loss, const SeedProvider& seed);
};

PipelineExecutor::PipelineExecutor(Schedule schedule, comm::Communicator& pp,
                                   std::vector<nn::Module*> chunks, ZeroOptimizer& zero,
                                   ExecutorOptions options) {
  check_inputs(schedule, pp, chunks, options);
  if (zero.stage() == 3) {
    // NOTE [ZeRO 3 under the pipeline] in pipeline/executor.hpp.
    for (size_t j = 0; j < chunks.size(); ++j) {
      const auto* wrapper = dynamic_cast<const ShardedModule*>(chunks[j]);
      LOOM_CHECK(wrapper != nullptr && wrapper->attached(), "pipeline executor: at ZeRO stage 3 ",
                 "each chunk must be a ShardedModule attached to the ZeroOptimizer (in ",
                 "ZeroOptions.modules), which gathers its parameters around each action; the "
                 "module of virtual stage ",
                 j, " on rank ", pp.rank(), " ('", chunks[j]->name(), "') is ",
                 wrapper == nullptr ? "not a ShardedModule" : "a ShardedModule not attached",
                 " (for a GPT: GPTChunks::shard_parameters(), then modules())");
    }
  }
  const int final_micro = final_micro_batch_of(schedule, pp.rank());
  impl_ = std::make_unique<Impl>(std::move(schedule), pp, std::move(chunks), zero, options);
  impl_->final_micro = final_micro;
}

PipelineExecutor::~PipelineExecutor() = default;

void PipelineExecutor::replace_schedule(Schedule schedule) {
  const Schedule& now = impl_->schedule;
  LOOM_CHECK(schedule.pp == now.pp && schedule.micro_batches == now.micro_batches &&
                 schedule.virtual_stages == now.virtual_stages &&
                 schedule.placement == now.placement,
             "pipeline executor: replace_schedule takes another order of the same work; '",
             schedule.name, "' has pp ", schedule.pp, ", ", schedule.micro_batches,
             " micro-batches, ", schedule.virtual_stages,
             " virtual stages (or another placement) "
             "where '",
             now.name, "' has pp ", now.pp, ", ", now.micro_batches, " and ", now.virtual_stages);
  check_inputs(schedule, impl_->pp, impl_->chunks, impl_->options);
  const int final_micro = final_micro_batch_of(schedule, impl_->pp.rank());
  impl_ = std::make_unique<Impl>(std::move(schedule), impl_->pp, impl_->chunks, impl_->zero,
                                 impl_->options);
  impl_->final_micro = final_micro;
}

const Schedule& PipelineExecutor::schedule() const {
  return impl_->schedule;
}
int PipelineExecutor::rank() const {
  return impl_->pp.rank();
}
bool PipelineExecutor::holds_first_chunk() const {
  return impl_->schedule.rank_of(0) == rank();
}
bool PipelineExecutor::holds_last_chunk() const {
  return impl_->schedule.rank_of(impl_->schedule.chunks() - 1) == rank();
}
int PipelineExecutor::final_micro_batch() const {
  return impl_->final_micro;
}

StepStats PipelineExecutor::step(const InputProvider& input, const LossFunction& loss,
                                 const SeedProvider& seed) {
  LOOM_CHECK(!impl_->failed, "pipeline executor, rank ", rank(),
             ": an earlier step failed, leaving messages half exchanged; build a new executor "
             "(and communicators) to continue");
  impl_->failed = true;
  StepStats stats = impl_->run(input, loss, seed);
  impl_->failed = false;
  return stats;
}

StepStats PipelineExecutor::Impl::run(const InputProvider& input, const LossFunction& loss_fn,
                                      const SeedProvider& seed) {
  const int rank = pp.rank();
  const int micro_batches = schedule.micro_batches;
  const int last_chunk = schedule.chunks() - 1;
  const int stages = schedule.virtual_stages;
  const std::vector<Action>& actions = schedule.ranks[static_cast<size_t>(rank)];
  const bool profiling = trace::Profiler::instance().enabled();
  StepStats stats;
  stats.chunk_seconds.resize(static_cast<size_t>(schedule.virtual_stages));
  if (options.loss_scaler != nullptr) stats.loss_scale = options.loss_scaler->scale();
  double loss_weight = 1;
  if (options.uneven != nullptr) {
    stats.stand_in = options.uneven->stand_in();
    loss_weight = options.uneven->loss_weight();
  }
  const int64_t step_start = trace::now_ns();
  messages.reset_counters();

  zero.zero_grad();
  // One tape id per micro-batch, shared by its chunks' tapes (nn/tape.hpp).
  std::vector<nn::Tape> ids(static_cast<size_t>(micro_batches));
  zero.set_last_micro_batch(ids[static_cast<size_t>(final_micro)]);
  std::vector<std::unique_ptr<nn::Tape>> tapes(static_cast<size_t>(micro_batches * stages));
  int live_tapes = 0;
  auto tape_of = [&](int m, int chunk) -> std::unique_ptr<nn::Tape>& {
    const int stage = schedule.placement.at(static_cast<size_t>(chunk)).virtual_stage;
    return tapes[static_cast<size_t>(m * stages + stage)];
  };
  auto module_of = [&](int chunk) -> nn::Module& {
    return *chunks[static_cast<size_t>(
        schedule.placement.at(static_cast<size_t>(chunk)).virtual_stage)];
  };

  // Tensors between actions, named like messages: activation (m, c) is chunk
  // c's output, gradient (m, c) chunk c's input gradient; gradient (m, last
  // chunk + 1) is the loss's gradient of the logits, scaled by 1 / M (and
  // fp16's loss scale).
  using Key = std::tuple<MessageKind, int, int>;
  std::map<Key, Tensor> values;
  auto take_value = [&](MessageKind kind, int m, int chunk, const Action& by) {
    auto it = values.find({kind, m, chunk});
    LOOM_CHECK(it != values.end() && it->second.defined(), "pipeline executor, rank ", rank, ": ",
               describe(by), " finds no ",
               kind == MessageKind::activation ? "activation" : "gradient", " of micro-batch ", m,
               " chunk ", chunk);
    Tensor out = std::move(it->second);
    values.erase(it);
    return out;
  };
  auto put_value = [&](MessageKind kind, int m, int chunk, Tensor t) {
    values[{kind, m, chunk}] = std::move(t);
  };

  // Receives posted ahead: the next `receives_ahead` of the list, always.
  std::vector<size_t> receive_steps;
  for (size_t i = 0; i < actions.size(); ++i) {
    if (is_recv(actions[i].kind)) receive_steps.push_back(i);
  }
  size_t posted = 0;
  auto post_until = [&](size_t count) {
    for (; posted < receive_steps.size() && posted < count; ++posted) {
      const Action& a = actions[receive_steps[posted]];
      messages.post(
          a.kind == ActionKind::recv_activation ? MessageKind::activation : MessageKind::gradient,
          a.micro_batch, a.chunk, a.peer);
    }
  };
  const size_t ahead = static_cast<size_t>(options.receives_ahead);
  post_until(ahead);
  size_t taken = 0;

  // Weights stay as they are until the optimizer step: pack each once
  // (NOTE [packed weight reuse] in loom/kernels/gemm.hpp); the scope ends at
  // reduce gradients, after the last compute action.
  std::optional<kernels::PackedWeightScope> packed_weights;
  if (options.packed_weight_bytes > 0 && zero.stage() < 3) {
    packed_weights.emplace(options.packed_weight_bytes);
  }
  auto end_packed_weights = [&] {
    if (!packed_weights) return;
    stats.packed_weights = packed_weights->stats();
    packed_weights.reset();
  };

  double loss_sum = 0;
  for (const Action& a : actions) {
    const int64_t start = trace::now_ns();
    double* compute_seconds = nullptr;
    double* chunk_seconds = nullptr;  // the same time, per chunk
    ChunkSeconds* chunk_times =
        is_compute(a.kind) ? &stats.chunk_seconds[static_cast<size_t>(
                                 schedule.placement.at(static_cast<size_t>(a.chunk)).virtual_stage)]
                           : nullptr;
    switch (a.kind) {
      case ActionKind::forward: {
        Tensor x;
        if (a.chunk == 0) {
          x = input(a.micro_batch);
          LOOM_CHECK(x.defined(), "pipeline executor: the input of micro-batch ", a.micro_batch,
                     " is undefined");
        } else {
          x = take_value(MessageKind::activation, a.micro_batch, a.chunk - 1, a);
        }
        std::unique_ptr<nn::Tape>& tape = tape_of(a.micro_batch, a.chunk);
        tape = std::make_unique<nn::Tape>();
        tape->set_micro_batch(ids[static_cast<size_t>(a.micro_batch)].micro_batch());
        tape->set_stand_in(stats.stand_in);
        if (seed) {
          const MicroBatchRandom random = seed(a.micro_batch);
          tape->set_random_seed(random.seed);
          tape->set_first_row(random.first_row);
        }
        stats.peak_tapes = std::max(stats.peak_tapes, ++live_tapes);
        Tensor y = module_of(a.chunk).forward(x, *tape);
        if (a.chunk == last_chunk) {
          // The mean over micro-batches, times the loss scale (fp16) and the
          // uneven inputs' loss weight (0 on a stand-in replica).
          const double dloss = stats.loss_scale / micro_batches * loss_weight;
          const Shape shape = y.shape();
          const DType dtype = y.dtype();
          LossOutput out = loss_fn(std::move(y), a.micro_batch, static_cast<float>(dloss));
          LOOM_CHECK(
              out.dlogits.defined() && out.dlogits.shape() == shape && out.dlogits.dtype() == dtype,
              "pipeline executor: the loss of micro-batch ", a.micro_batch, " returned dlogits ",
              out.dlogits.defined() ? out.dlogits.str() : "undefined", " for logits ",
              shape_str(shape), " ", dtype, "; it must have the logits' shape and dtype");
          loss_sum += out.loss;
          put_value(MessageKind::gradient, a.micro_batch, last_chunk + 1, std::move(out.dlogits));
        } else {
          put_value(MessageKind::activation, a.micro_batch, a.chunk, std::move(y));
        }
        compute_seconds = &stats.forward_seconds;
        chunk_seconds = &chunk_times->forward;
        break;
      }
      case ActionKind::backward_input:
      case ActionKind::backward: {
        Tensor dy = take_value(MessageKind::gradient, a.micro_batch, a.chunk + 1, a);
        std::unique_ptr<nn::Tape>& tape = tape_of(a.micro_batch, a.chunk);
        LOOM_CHECK(tape != nullptr, "pipeline executor, rank ", rank, ": ", describe(a),
                   " has no tape (its forward did not run)");
        nn::Module& module = module_of(a.chunk);
        const bool fused = a.kind == ActionKind::backward;
        Tensor dx = fused ? module.backward(dy, *tape) : module.backward_input(dy, *tape);
        if (a.chunk > 0) {
          LOOM_CHECK(dx.defined(), "pipeline executor: chunk ", a.chunk, " ('", module.name(),
                     "') returned no input gradient; every chunk after the first must");
          put_value(MessageKind::gradient, a.micro_batch, a.chunk, std::move(dx));
        }
        if (fused) {
          LOOM_CHECK(tape->empty(), "pipeline executor: the tape of micro-batch ", a.micro_batch,
                     " chunk ", a.chunk, " still holds ", tape->size(),
                     " saved state(s) after its backward");
          tape.reset();
          --live_tapes;
        }
        compute_seconds = fused ? &stats.backward_seconds : &stats.backward_input_seconds;
        chunk_seconds = fused ? &chunk_times->backward : &chunk_times->backward_input;
        break;
      }
      case ActionKind::backward_weight: {
        std::unique_ptr<nn::Tape>& tape = tape_of(a.micro_batch, a.chunk);
        LOOM_CHECK(tape != nullptr, "pipeline executor, rank ", rank, ": ", describe(a),
                   " has no tape (its forward did not run)");
        module_of(a.chunk).backward_weight(*tape);
        LOOM_CHECK(tape->empty(), "pipeline executor: the tape of micro-batch ", a.micro_batch,
                   " chunk ", a.chunk, " still holds ", tape->size(),
                   " saved state(s) after its backward_weight");
        tape.reset();
        --live_tapes;
        compute_seconds = &stats.backward_weight_seconds;
        chunk_seconds = &chunk_times->backward_weight;
        break;
      }
      case ActionKind::send_activation:
      case ActionKind::send_gradient: {
        const MessageKind kind =
            a.kind == ActionKind::send_activation ? MessageKind::activation : MessageKind::gradient;
        messages.send(kind, a.micro_batch, a.chunk, a.peer,
                      take_value(kind, a.micro_batch, a.chunk, a));
        break;
      }
      case ActionKind::recv_activation:
      case ActionKind::recv_gradient: {
        const MessageKind kind =
            a.kind == ActionKind::recv_activation ? MessageKind::activation : MessageKind::gradient;
        put_value(kind, a.micro_batch, a.chunk,
                  messages.take(kind, a.micro_batch, a.chunk, a.peer, stats.recv_wait_seconds));
        post_until(++taken + ahead);
        break;
      }
      case ActionKind::reduce_gradients:
        end_packed_weights();
        zero.finish();
        if (options.clip_grad_norm > 0 || options.loss_scaler != nullptr) {
          stats.grad_norm = zero.clip_grad_norm(
              options.clip_grad_norm > 0 ? options.clip_grad_norm : HUGE_VAL, stats.loss_scale);
        }
        compute_seconds = &stats.reduce_seconds;
        break;
      case ActionKind::optimizer_step:
        end_packed_weights();
        // A non-finite global norm (the same on every rank) skips the update,
        // as train_gpt's step without a pipeline does.
        if (options.loss_scaler != nullptr) {
          stats.stepped = options.loss_scaler->update(stats.grad_norm);
        } else {
          stats.stepped = options.clip_grad_norm <= 0 || std::isfinite(stats.grad_norm);
        }
        if (stats.stepped) zero.step();
        compute_seconds = &stats.optimizer_seconds;
        break;
    }
    if (compute_seconds != nullptr && device.is_cuda() && options.synchronize_device_actions) {
      current_stream(device).synchronize();
    }
    const int64_t end = trace::now_ns();
    if (compute_seconds != nullptr) *compute_seconds += seconds_between(start, end);
    if (chunk_seconds != nullptr) *chunk_seconds += seconds_between(start, end);
    if (profiling) trace::record_span("pipeline", label(a, stages > 1), start, end);
    messages.reap_sends();
  }
  stats.send_wait_seconds = messages.wait_sends();

  // Broken invariants, not user errors: a validated schedule consumes every
  // tensor it produces and releases every tape.
  LOOM_CHECK(values.empty() && live_tapes == 0 && messages.posted() == 0,
             "pipeline executor, rank ", rank, ": the step ended with ", values.size(),
             " unconsumed tensor(s), ", live_tapes, " tape(s) alive and ", messages.posted(),
             " receive(s) not taken");

  const bool holds_loss = schedule.rank_of(last_chunk) == rank;
  stats.loss = holds_loss ? loss_sum / micro_batches : std::numeric_limits<double>::quiet_NaN();
  if (options.broadcast_loss && schedule.pp > 1) {
    // The double's bits, unrounded.
    int64_t bits = 0;
    std::memcpy(&bits, &stats.loss, sizeof bits);
    Tensor shared = Tensor::from_vector(std::vector<int64_t>{bits}, {1});
    pp.broadcast(shared, {.root = schedule.rank_of(last_chunk)}).wait();
    bits = shared.item<int64_t>();
    std::memcpy(&stats.loss, &bits, sizeof bits);
  }
  stats.messages_sent = messages.messages_sent();
  stats.bytes_sent = messages.bytes_sent();
  stats.messages_received = messages.messages_received();
  stats.step_seconds = seconds_between(step_start, trace::now_ns());
  return stats;
}

ActionCosts measured_costs(const Schedule& schedule, comm::Communicator& pp, const StepStats& stats,
                           comm::Communicator* replicas) {
  LOOM_CHECK(pp.size() == schedule.pp, "measured_costs: the pp group has ", pp.size(),
             " ranks, the schedule ", schedule.pp);
  const auto stages = static_cast<size_t>(schedule.virtual_stages);
  LOOM_CHECK(stats.chunk_seconds.size() == stages, "measured_costs: the step's stats hold ",
             stats.chunk_seconds.size(), " chunks, the schedule runs ", stages, " per rank");
  // Per virtual stage F, B, W per micro-batch, as the bits of doubles.
  std::vector<int64_t> mine;
  for (const ChunkSeconds& c : stats.chunk_seconds) {
    for (const double total : {c.forward, c.backward_input + c.backward, c.backward_weight}) {
      mine.push_back(std::bit_cast<int64_t>(total / schedule.micro_batches));
    }
  }
  const auto per_rank = static_cast<int64_t>(mine.size());
  const Tensor all = Tensor::empty({pp.size() * per_rank}, DType::i64);
  pp.all_gather(Tensor::from_vector(mine, {per_rank}), all).wait();
  const std::vector<int64_t> bits = all.to_vector<int64_t>();
  ActionCosts costs;
  const auto chunks = static_cast<size_t>(schedule.chunks());
  costs.forward.assign(chunks, 0.0);
  costs.backward_input.assign(chunks, 0.0);
  costs.backward_weight.assign(chunks, 0.0);
  for (size_t c = 0; c < chunks; ++c) {
    const ChunkPlace place = schedule.placement[c];
    const size_t at = static_cast<size_t>(place.rank) * mine.size() +
                      static_cast<size_t>(place.virtual_stage) * 3;
    costs.forward[c] = std::bit_cast<double>(bits[at]);
    costs.backward_input[c] = std::bit_cast<double>(bits[at + 1]);
    costs.backward_weight[c] = std::bit_cast<double>(bits[at + 2]);
  }
  if (replicas != nullptr && replicas->size() > pp.size()) {
    for (std::vector<double>* kind :
         {&costs.forward, &costs.backward_input, &costs.backward_weight}) {
      for (double& seconds : *kind) seconds = mean_over(*replicas, seconds);
    }
  }
  return costs;
}

std::vector<Tensor> split_micro_batches(const Tensor& batch, int micro_batches) {
  LOOM_CHECK(micro_batches >= 1, "micro-batches ", micro_batches, " must be at least 1");
  LOOM_CHECK(batch.defined() && batch.dim() >= 1,
             "a batch to split into micro-batches needs a "
             "batch dimension; got ",
             batch.defined() ? batch.str() : "an undefined tensor");
  const int64_t rows = batch.size(0);
  LOOM_CHECK(rows % micro_batches == 0, "global batch of ", rows, " rows is not divisible by ",
             micro_batches, " micro-batches (each micro-batch takes batch / micro-batches rows)");
  const int64_t n = rows / micro_batches;
  std::vector<Tensor> out;
  for (int m = 0; m < micro_batches; ++m) out.push_back(batch.slice(m * n, (m + 1) * n));
  return out;
}

}  // namespace loom::parallel::pipeline
