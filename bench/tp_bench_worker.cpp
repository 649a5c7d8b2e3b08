// tp_bench's worker: see tp_bench_worker.hpp, and tp_bench.cpp for what a
// run measures.
#include "tp_bench_worker.hpp"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_models.hpp"
#include "bench_util.hpp"
#include "comm/work_state.hpp"  // NoCommGroup completes its own Work (a backend's job)
#include "loom/loom.hpp"
#include "rank_facts.hpp"
#include "run_json.hpp"

namespace loom::bench::tp_bench {
namespace {

using loom::Tensor;
using loom::bench::cpu_seconds;
using loom::bench::median;

// NOTE [ceiling]: a tp group whose collectives complete at once, moving
// nothing between ranks; the values each rank keeps are its own.
class NoCommGroup final : public loom::comm::Communicator {
 public:
  NoCommGroup(int rank, int size) : Communicator("tp (no communication)", rank, size, iota(size)) {}
  std::string_view backend() const override { return "none"; }

 protected:
  using WorkPtr = loom::comm::detail::WorkPtr;
  void start_all_reduce(const Tensor&, const loom::comm::AllReduceOptions&,
                        const WorkPtr& work) override {
    done(work);  // each rank keeps its partial sum
  }
  void start_all_gather(const Tensor& input, const Tensor& output,
                        const std::vector<int64_t>& counts, const WorkPtr& work) override {
    int64_t offset = 0;  // this rank's slice into every slot
    for (const int64_t count : counts) {
      output.flat_view(offset, {count}).copy_from(input.flat_view(0, {count}));
      offset += count;
    }
    done(work);
  }
  void start_reduce_scatter(const Tensor& input, const Tensor& output,
                            const loom::comm::ReduceScatterOptions& options,
                            const WorkPtr& work) override {
    const auto& counts = options.counts;
    const int64_t offset = std::accumulate(counts.begin(), counts.begin() + rank(), int64_t{0});
    output.flat_view(0, {counts[rank()]}).copy_from(input.flat_view(offset, {counts[rank()]}));
    done(work);
  }
  void start_barrier(const WorkPtr& work) override { done(work); }
  // Host or CUDA tensors: the copies above are queued on the tensors'
  // device like the compute around them.
  void check_tensor_support(const Tensor&, const char*) const override {}

 private:
  static std::vector<int> iota(int size) {
    std::vector<int> ranks(static_cast<size_t>(size));
    std::iota(ranks.begin(), ranks.end(), 0);
    return ranks;
  }
  static void done(const WorkPtr& work) {
    work->mark_started();
    work->complete();
  }
};

// Random token ids [batch, seq], the same on every rank (tp ranks read one batch).
Tensor random_ids(const BenchGPT& b, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(b.config.vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(b.batch * b.config.seq_len));
  for (auto& id : ids) id = pick(rng);
  return Tensor::from_vector(ids, {b.batch, b.config.seq_len});
}

// The loss of the full logits on one rank, or of each tp rank's vocabulary columns.
struct Loss {
  loom::nn::CrossEntropyLoss single;
  std::unique_ptr<loom::parallel::VocabParallelCrossEntropy> vocab_parallel;
  Tensor forward(const Tensor& logits, const Tensor& targets, loom::nn::Tape& tape) {
    return vocab_parallel ? vocab_parallel->forward(logits, targets, tape)
                          : single.forward(logits, targets, tape);
  }
  Tensor backward(loom::nn::Tape& tape) {
    return vocab_parallel ? vocab_parallel->backward(tape) : single.backward(tape);
  }
};

// Every LayerNorm of `module`, depth first.
void find_layer_norms(loom::nn::Module& module, std::vector<loom::nn::LayerNorm*>& out) {
  if (auto* ln = dynamic_cast<loom::nn::LayerNorm*>(&module)) out.push_back(ln);
  for (loom::nn::Module* child : module.children()) find_layer_norms(*child, out);
}

// The collectives `group` issued since collective number `last` (updated).
CommCount collectives_since(const loom::comm::Communicator& group, uint64_t& last) {
  using loom::comm::OpType;
  CommCount count;
  const double n = group.size();
  bool first = true;
  for (const auto& record : group.flight_recorder().snapshot()) {
    const auto& info = record.info;
    if (info.op == OpType::send || info.op == OpType::recv || info.seq <= last) continue;
    LOOM_CHECK(!first || info.seq == last + 1, "tp_bench: the flight recorder of '", group.name(),
               "' dropped collectives ", last + 1, "..", info.seq - 1,
               " of a step; raise LOOM_FLIGHT_RECORDER_SIZE");
    first = false;
    last = info.seq;
    const auto bytes = static_cast<int64_t>(info.bytes);
    if (info.op == OpType::all_reduce) {
      count.add(0, bytes, 2 * (n - 1) / n);
    } else if (info.op == OpType::all_gather) {
      count.add(1, bytes * group.size(), (n - 1) / n);  // info counts this rank's input
    } else if (info.op == OpType::reduce_scatter) {
      count.add(2, bytes, (n - 1) / n);
    } else {
      count.add(3, bytes, 1.0);
    }
  }
  return count;
}

// One run; rank 0 prints its JSON on the last line.

}  // namespace

int run_worker(const WorkerFlags& f) {
  namespace parallel = loom::parallel;
  loom::Context launch = loom::init();
  const std::shared_ptr<loom::comm::Communicator> world = launch.world();
  const int tp = world->size();
  LOOM_CHECK(tp > 1 || (!f.sp && !f.no_comm),
             "tp_bench: --sp and --no-comm need 2 or more ranks (tp = the ranks of the run)");
  BenchGPT b = bench_gpt(f.model);
  LOOM_CHECK(f.device != "cuda" || loom::cuda_device_count() > 0,
             "--device cuda: ", loom::cuda_unavailable_reason());
  const loom::Device device =
      f.device == "cuda" ? loom::device_for_local_rank(launch.local_rank()) : loom::Device::cpu();
  b.config.module.device = device;
  // Device work queued by a step is waited for before a clock is read.
  auto settle = [&] { loom::current_stream(device).synchronize(); };

  // tp > 1: one replica over all ranks (dp = 1); the ceiling swaps its tp group.
  std::optional<parallel::ParallelGroups> groups;
  std::shared_ptr<loom::comm::Communicator> tp_group;
  std::unique_ptr<parallel::TensorParallelGPTLayers> tp_layers;
  parallel::ReductionGroups reductions;
  if (tp > 1) {
    groups = parallel::make_parallel_groups(world, parallel::ParallelLayout(tp, tp, 1));
    tp_group = f.no_comm ? std::make_shared<NoCommGroup>(world->rank(), tp) : groups->tp;
    tp_layers = std::make_unique<parallel::TensorParallelGPTLayers>(
        tp_group, parallel::TensorParallelOptions{.sequence_parallel = f.sp});
    tp_layers->check(b.config);
    reductions = {.tp = tp_group.get(), .embedding = nullptr, .model = tp_group.get()};
  }
  loom::comm::Communicator& dp = groups ? *groups->dp : *world;
  loom::models::GPT model("", b.config,
                          tp_layers ? static_cast<const loom::models::GPTLayerFactory&>(*tp_layers)
                                    : loom::models::default_gpt_layers());
  parallel::ZeroOptimizer zero(model.parameters(), dp, loom::bench::benchmark_adamw(),
                               parallel::ZeroOptions{.stage = 0, .groups = reductions});
  Loss loss_fn;
  if (tp > 1) {
    loss_fn.vocab_parallel =
        std::make_unique<parallel::VocabParallelCrossEntropy>("loss", b.config.vocab, tp_group);
  }
  const Tensor inputs = random_ids(b, 1).to(device), targets = random_ids(b, 2).to(device);
  loom::Allocator& allocator = loom::allocator_for(device);

  // Per timed step: wall ms, CPU ms of the compute thread, CPU ms of the
  // process's other threads, counted GFLOP (reduced to the slowest rank).
  constexpr size_t kFields = 4;
  std::vector<float> record;
  std::vector<CommCount> comm;  // per timed step, this rank's tp collectives
  int64_t step_peak = 0;
  uint64_t last_seq = 0;
  loom::bench::CpuShare share;
  for (int step = 0; step < f.warmup + f.steps; ++step) {
    const bool timed = step >= f.warmup;
    if (step == f.warmup) share.start();
    allocator.reset_peak_stats();
    const auto rest = static_cast<int64_t>(allocator.stats().allocated_bytes);
    settle();
    const double flops_start = loom::trace::thread_counted_cost().flops;
    const double thread_start = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
    const double process_start = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
    const auto start = std::chrono::steady_clock::now();
    zero.zero_grad();
    loom::nn::Tape tape, loss_tape;
    const Tensor logits = model.forward(inputs, tape);
    loss_fn.forward(logits, targets, loss_tape);
    model.backward(loss_fn.backward(loss_tape), tape);
    zero.finish();
    zero.step();
    settle();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const double thread_ms = 1e3 * (cpu_seconds(CLOCK_THREAD_CPUTIME_ID) - thread_start);
    const double process_ms = 1e3 * (cpu_seconds(CLOCK_PROCESS_CPUTIME_ID) - process_start);
    const double gflop = 1e-9 * (loom::trace::thread_counted_cost().flops - flops_start);
    const CommCount moved = tp_group ? collectives_since(*tp_group, last_seq) : CommCount{};
    if (!timed) continue;
    step_peak =
        std::max(step_peak, static_cast<int64_t>(allocator.stats().peak_allocated_bytes) - rest);
    record.insert(record.end(),
                  {static_cast<float>(ms), static_cast<float>(thread_ms),
                   static_cast<float>(process_ms - thread_ms), static_cast<float>(gflop)});
    comm.push_back(moved);
  }
  share.stop();

  // NOTE [activation bytes]: one more forward, never backpropagated.
  int64_t activation_bytes = 0, layernorm_bytes = 0;
  {
    zero.zero_grad();
    const auto rest = static_cast<int64_t>(allocator.stats().allocated_bytes);
    loom::nn::Tape tape, loss_tape;
    {
      const Tensor logits = model.forward(inputs, tape);
      loss_fn.forward(logits, targets, loss_tape);
    }
    const auto held = static_cast<int64_t>(allocator.stats().allocated_bytes);
    activation_bytes = held - rest;
    std::vector<loom::nn::LayerNorm*> norms;
    find_layer_norms(model, norms);
    for (loom::nn::LayerNorm* ln : norms) tape.release(*ln);
    layernorm_bytes = held - static_cast<int64_t>(allocator.stats().allocated_bytes);
  }
  int64_t param_bytes = 0;
  for (const loom::nn::Parameter* p : model.parameters()) {
    param_bytes += static_cast<int64_t>(p->value().nbytes());
  }

  const json facts = loom::bench::gather_rank_facts(*world, share.share());
  Tensor slowest = Tensor::from_vector(record, {static_cast<int64_t>(record.size())});
  if (tp > 1) world->all_reduce(slowest, {.op = loom::comm::ReduceOp::max}).wait();
  std::vector<int64_t> memory = {param_bytes, activation_bytes, layernorm_bytes, step_peak};
  if (tp > 1) {
    const Tensor all = Tensor::zeros({static_cast<int64_t>(memory.size()) * tp}, loom::DType::i64);
    world->all_gather(Tensor::from_vector(memory, {static_cast<int64_t>(memory.size())}), all)
        .wait();
    memory = all.to_vector<int64_t>();
  }
  if (launch.rank() != 0) return 0;
  const std::vector<float> all = slowest.to_vector<float>();
  std::array<std::vector<double>, kFields> series;
  for (size_t i = 0; i + kFields <= all.size(); i += kFields) {
    for (size_t j = 0; j < kFields; ++j) series[j].push_back(all[i + j]);
  }
  auto per_rank = [&](size_t field) {
    std::vector<int64_t> out;
    for (size_t r = field; r < memory.size(); r += 4) out.push_back(memory[r]);
    return out;
  };
  const bool steady =
      std::all_of(comm.begin(), comm.end(), [&](const CommCount& c) { return c == comm.front(); });
  json out{{"model", f.model},
           {"device", device.str()},
           {"tp", tp},
           {"sp", f.sp},
           {"no_comm", f.no_comm},
           {"step_ms_all", series[0]},
           {"step_ms", median(series[0])},
           {"compute_cpu_ms", median(series[1])},
           {"other_cpu_ms", median(series[2])},
           {"gflop_per_step", median(series[3])},
           {"comm", comm.empty() ? CommCount{}.to_json() : comm.front().to_json()},
           {"comm_same_every_step", steady},
           {"param_bytes", per_rank(0)},
           {"activation_bytes", per_rank(1)},
           {"layernorm_region_bytes", per_rank(2)},
           {"step_peak_bytes", per_rank(3)}};
  out.update(facts);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace loom::bench::tp_bench
