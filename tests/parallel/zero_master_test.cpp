// ZeRO with bf16/f16 parameters (local backend, ranks as threads): stages 1-3
// keep an f32 master copy of each rank's shard. The test writes deterministic
// low-precision gradients straight into the parameters (no forward: the host
// GEMM is f32-only) and replays the run in plain f32: the gradient averaged
// as the local backend reduces it (f32 sum in rank order, times 1/N, rounded
// to the parameters' dtype), widened, optionally clipped, stepped on the f32
// master with the kernels' formulas, and rounded to the parameters' dtype.
//
// Tolerance: master |got - ref| <= 1e-6 + 1e-6 |ref| (the reference runs the
// same f32 operations; only the compiler's contraction of products may differ);
// every parameter value equals its own master rounded to nearest even exactly,
// and is within one unit in the last place of the reference master, rounded.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loom/comm/local.hpp"
#include "loom/core/error.hpp"
#include "loom/core/half.hpp"
#include "loom/nn/module.hpp"
#include "loom/parallel/sharded_module.hpp"
#include "loom/parallel/zero.hpp"
#include "support/compare.hpp"
#include "support/param_bag.hpp"

using namespace loom;

namespace {

using test::ParamBag;

enum class Opt { sgd, adamw };

struct MasterRun {
  int ranks = 2;
  int stage = 1;
  Opt optimizer = Opt::adamw;
  DType dtype = DType::bf16;
  int steps = 4;
  double clip = 0;  // > 0: clip_grad_norm(clip) before each step
};

optim::SgdOptions sgd_options() {
  return {.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01};
}
optim::AdamWOptions adamw_options() {
  return {.lr = 0.01, .weight_decay = 0.1};
}

struct RankResult {
  std::vector<std::vector<float>> values;  // per parameter, widened
  // Master pieces: parameter index -> (begin, elements).
  std::vector<std::tuple<size_t, int64_t, std::vector<float>>> master;
  parallel::MemoryStats memory;
  int64_t shard = 0;
  size_t state_bytes = 0;
};

// Runs on a rank thread: its checks throw (run_local_ranks rethrows on the
// test's thread; Catch2's macros are not thread-safe).
RankResult run_rank(const MasterRun& run, comm::Communicator& c) {
  std::vector<std::vector<float>> init;
  for (size_t j = 0; j < test::kBagParams; ++j) init.push_back(test::bag_initial(j));
  const std::vector<std::vector<float>> init_a(init.begin(), init.begin() + 3);
  const std::vector<std::vector<float>> init_b(init.begin() + 3, init.end());
  parallel::ShardedModule a(std::make_unique<ParamBag>("a", test::kBagSizesA, init_a, run.dtype));
  parallel::ShardedModule b(std::make_unique<ParamBag>("b", test::kBagSizesB, init_b, run.dtype));
  std::vector<nn::Parameter*> params = a.parameters();
  for (nn::Parameter* p : b.parameters()) params.push_back(p);
  const parallel::OptimizerOptions options = run.optimizer == Opt::sgd
                                                 ? parallel::OptimizerOptions(sgd_options())
                                                 : parallel::OptimizerOptions(adamw_options());
  std::vector<parallel::ShardedModule*> units;
  if (run.stage == 3) units = {&a, &b};
  parallel::ZeroOptimizer zero(
      params, c, options,
      {.stage = run.stage, .first_bucket_bytes = 96, .bucket_cap_bytes = 128, .modules = units});
  for (int t = 0; t < run.steps; ++t) {
    zero.zero_grad();
    for (size_t j = test::kBagParams; j-- > 0;) {  // backward order
      std::vector<float> g(static_cast<size_t>(test::bag_size(j)));
      for (size_t k = 0; k < g.size(); ++k) g[k] = test::bag_gradient(c.rank(), t, j, k);
      nn::Parameter::GradWrite w = params[j]->begin_grad_write();
      LOOM_CHECK(!w.accumulate, params[j]->name(), ": the first write after zero_grad accumulates");
      w.grad.copy_from(Tensor::from_vector(g, {test::bag_size(j)}));  // rounds to the dtype
      params[j]->end_grad_write();
    }
    zero.finish();
    if (run.clip > 0) (void)zero.clip_grad_norm(run.clip);
    zero.step();
  }
  RankResult out;
  out.memory = zero.memory();
  out.shard = zero.shard_numel();
  out.state_bytes = zero.optimizer().state_bytes();
  zero.gather_parameters();
  for (nn::Parameter* p : params) {
    LOOM_CHECK(p->dtype() == run.dtype, p->name(), " is ", p->dtype(), ", not ", run.dtype);
    out.values.push_back(p->value().to_vector<float>());
  }
  zero.release_parameters();
  // Slots are named "<parameter>[begin:end]".
  for (const optim::ParamSlot& slot : zero.optimizer().slots()) {
    LOOM_CHECK(slot.value.dtype() == DType::f32, "master slot ", slot.name, " is ",
               slot.value.dtype(), ", not f32");
    const size_t open = slot.name.rfind('[');
    const size_t colon = slot.name.find(':', open);
    const std::string name = slot.name.substr(0, open);
    size_t j = 0;
    while (j < test::kBagParams && params[j]->name() != name) ++j;
    LOOM_CHECK(j < test::kBagParams, "master slot ", slot.name, " names no parameter");
    const int64_t begin = std::stoll(slot.name.substr(open + 1, colon - open - 1));
    out.master.emplace_back(j, begin, slot.value.to_vector<float>());
  }
  return out;
}

// The run replayed in f32, one replica: the final master values per parameter.
std::vector<std::vector<float>> reference(const MasterRun& run) {
  std::vector<std::vector<float>> master, buf1, buf2;
  for (size_t j = 0; j < test::kBagParams; ++j) {
    std::vector<float> v = test::bag_initial(j);
    for (float& x : v) x = test::round_to(run.dtype, x);
    master.push_back(v);
    buf1.emplace_back(v.size(), 0.0f);
    buf2.emplace_back(v.size(), 0.0f);
  }
  const float inv = 1.0f / static_cast<float>(run.ranks);
  for (int t = 0; t < run.steps; ++t) {
    std::vector<std::vector<float>> grad(test::kBagParams);
    double squares = 0;
    for (size_t j = 0; j < test::kBagParams; ++j) {
      for (size_t k = 0; k < master[j].size(); ++k) {
        float sum = test::round_to(run.dtype, test::bag_gradient(0, t, j, k));
        for (int r = 1; r < run.ranks; ++r)
          sum += test::round_to(run.dtype, test::bag_gradient(r, t, j, k));
        const float g = test::round_to(run.dtype, sum * inv);
        grad[j].push_back(g);
        squares += static_cast<double>(g) * g;
      }
    }
    const double norm = std::sqrt(squares);
    if (run.clip > 0 && norm > run.clip) {
      const auto factor = static_cast<float>(run.clip / (norm + 1e-6));
      for (auto& g : grad) {
        for (float& x : g) x = x * factor;
      }
    }
    const int64_t step = t + 1;
    for (size_t j = 0; j < test::kBagParams; ++j) {
      for (size_t k = 0; k < master[j].size(); ++k) {
        float& p = master[j][k];
        const float g = grad[j][k];
        if (run.optimizer == Opt::sgd) {
          const optim::SgdOptions o = sgd_options();
          const float gi = g + static_cast<float>(o.weight_decay) * p;
          float& b = buf1[j][k];
          b = step == 1
                  ? gi
                  : static_cast<float>(o.momentum) * b + static_cast<float>(1.0 - o.dampening) * gi;
          p = p - static_cast<float>(o.lr) * b;
        } else {
          const optim::AdamWOptions o = adamw_options();
          float& m = buf1[j][k];
          float& v = buf2[j][k];
          m = static_cast<float>(o.beta1) * m + static_cast<float>(1.0 - o.beta1) * g;
          v = static_cast<float>(o.beta2) * v + static_cast<float>(1.0 - o.beta2) * (g * g);
          const auto bc2 = static_cast<float>(std::sqrt(1.0 - std::pow(o.beta2, step)));
          const auto step_size = static_cast<float>(o.lr / (1.0 - std::pow(o.beta1, step)));
          const float denom = std::sqrt(v) / bc2 + static_cast<float>(o.eps);
          p = p * static_cast<float>(1.0 - o.lr * o.weight_decay) - step_size * (m / denom);
        }
      }
    }
  }
  return master;
}

std::vector<RankResult> run_ranks(const MasterRun& run) {
  std::vector<RankResult> out(static_cast<size_t>(run.ranks));
  comm::run_local_ranks(comm::make_local_group(run.ranks, "dp"), [&](comm::Communicator& c) {
    out[static_cast<size_t>(c.rank())] = run_rank(run, c);
  });
  return out;
}

// One unit in the last place of `x` in `dtype`.
float ulp(DType dtype, float x) {
  const int mantissa_bits = dtype == DType::bf16 ? 7 : 10;
  return std::ldexp(1.0f, std::ilogb(std::max(std::abs(x), 1e-4f)) - mantissa_bits);
}

std::string describe(const MasterRun& run) {
  return str_cat(dtype_name(run.dtype), " ", run.optimizer == Opt::sgd ? "sgd" : "adamw", " stage ",
                 run.stage, ", ", run.ranks, " ranks",
                 run.clip > 0 ? str_cat(", clip ", run.clip) : "");
}

void check_master_run(const MasterRun& run) {
  INFO(describe(run));
  const auto ref = reference(run);
  const auto got = run_ranks(run);
  std::vector<std::vector<int>> covered(test::kBagParams);
  for (size_t j = 0; j < test::kBagParams; ++j) covered[j].assign(ref[j].size(), 0);
  for (int r = 0; r < run.ranks; ++r) {
    INFO("rank " << r);
    const RankResult& res = got[static_cast<size_t>(r)];
    CHECK(res.values == got[0].values);  // replicas identical
    for (const auto& [j, begin, piece] : res.master) {
      for (size_t k = 0; k < piece.size(); ++k) {
        const size_t at = static_cast<size_t>(begin) + k;
        ++covered[j][at];
        const float want = ref[j][at];
        CHECK(loom::test::close(piece[k], want, 1e-6, 1e-6));
        // The parameter is its master rounded to nearest even.
        CHECK(res.values[j][at] == test::round_to(run.dtype, piece[k]));
        const float ulps =
            std::abs(res.values[j][at] - test::round_to(run.dtype, want)) / ulp(run.dtype, want);
        CHECK(ulps <= 1.0f);
      }
    }
  }
  for (size_t j = 0; j < test::kBagParams; ++j) {
    for (const int n : covered[j]) REQUIRE(n == 1);  // each element in exactly one master shard
  }
  // Training moved most parameter values.
  size_t moved = 0, elements = 0;
  for (size_t j = 0; j < test::kBagParams; ++j) {
    const std::vector<float> init = test::bag_initial(j);
    for (size_t k = 0; k < init.size(); ++k) {
      moved += got[0].values[j][k] != test::round_to(run.dtype, init[k]) ? 1 : 0;
      ++elements;
    }
  }
  CHECK(moved * 2 > elements);
}

}  // namespace

TEST_CASE("zero master: bf16 stages 1-3 step an f32 master (SGD, AdamW, 2 and 3 ranks)", "[zero]") {
  for (const int ranks : {2, 3}) {
    for (const int stage : {1, 2, 3}) {
      for (const Opt opt : {Opt::sgd, Opt::adamw}) {
        check_master_run({.ranks = ranks, .stage = stage, .optimizer = opt, .steps = 5});
      }
    }
  }
  // Clipping on the widened shards: the global norm over the ranks.
  check_master_run({.ranks = 3, .stage = 2, .optimizer = Opt::adamw, .steps = 3, .clip = 0.2});
  check_master_run({.ranks = 2, .stage = 3, .optimizer = Opt::sgd, .steps = 3, .clip = 0.2});
}

TEST_CASE("zero master: f16 parameters (stages 1-3)", "[zero]") {
  check_master_run({.ranks = 3, .stage = 1, .optimizer = Opt::sgd, .dtype = DType::f16});
  check_master_run({.ranks = 2, .stage = 2, .optimizer = Opt::adamw, .dtype = DType::f16});
  check_master_run(
      {.ranks = 3, .stage = 3, .optimizer = Opt::adamw, .dtype = DType::f16, .clip = 0.2});
}

namespace {

// Stage `stage`, plain SGD lr 1e-4, every rank's gradient 1: the final values.
std::vector<float> small_updates(int stage, int steps, const std::vector<float>& init) {
  std::vector<float> out;
  std::mutex mutex;
  comm::run_local_ranks(comm::make_local_group(2, "dp"), [&](comm::Communicator& c) {
    ParamBag bag("bag", {{"w", static_cast<int64_t>(init.size())}}, {init}, DType::bf16);
    parallel::ZeroOptimizer zero(bag.parameters(), c, optim::SgdOptions{.lr = 1e-4},
                                 {.stage = stage});
    nn::Parameter& w = *bag.parameters()[0];
    for (int t = 0; t < steps; ++t) {
      zero.zero_grad();
      w.begin_grad_write().grad.fill(1.0);
      w.end_grad_write();
      zero.finish();
      zero.step();
    }
    zero.wait_parameters();
    std::lock_guard lock(mutex);
    if (c.rank() == 0) out = w.value().to_vector<float>();
  });
  return out;
}

}  // namespace

TEST_CASE("zero master: the f32 master keeps updates below half a bf16 ulp", "[zero]") {
  // Updates of 1e-4 on values in [0.5, 1.25]: half a bf16 ulp there is 2^-9 or
  // 2^-8 (2e-3, 4e-3), so a bf16 update rounds back to the old value.
  constexpr int kSteps = 200;
  std::vector<float> init;
  for (int k = 0; k < 64; ++k) init.push_back(test::round_to(DType::bf16, 0.5f + 0.0117f * k));
  const std::vector<float> plain = small_updates(0, kSteps, init);
  const std::vector<float> mastered = small_updates(1, kSteps, init);
  CHECK(plain == init);  // stage 0 steps the bf16 values: every update lost
  for (size_t k = 0; k < init.size(); ++k) {
    float ref = init[k];
    for (int t = 0; t < kSteps; ++t) ref = ref - 1e-4f * 1.0f;
    INFO("element " << k << ": init " << init[k] << ", f32 reference " << ref);
    CHECK(mastered[k] == test::round_to(DType::bf16, ref));
    CHECK(init[k] - mastered[k] >= 0.02f - ulp(DType::bf16, init[k]));  // moved by ~200 x 1e-4
  }
}

TEST_CASE("zero master: optimizer bytes count the f32 master shard", "[zero]") {
  // Stage 1, AdamW, bf16: (2 moments + master) x 4 bytes per element of the shard.
  for (const int ranks : {2, 4}) {
    const MasterRun run{.ranks = ranks, .stage = 1, .optimizer = Opt::adamw, .steps = 1};
    const auto got = run_ranks(run);
    int64_t total = 0;
    for (size_t j = 0; j < test::kBagParams; ++j) total += test::bag_size(j);
    // Padding: at most 31 bf16 elements before each parameter (64-byte alignment)
    // and 32 per rank to round the shard up.
    const int64_t padding = 32 * (static_cast<int64_t>(test::kBagParams) + ranks);
    int64_t sum = 0, moments = 0;
    for (const RankResult& r : got) {
      INFO(ranks << " ranks: optimizer " << r.memory.optimizer_bytes << " bytes, shard " << r.shard
                 << " elements");
      // The moments cover the rank's parameter elements; the master its whole shard.
      CHECK(r.memory.optimizer_bytes == r.state_bytes + 4 * static_cast<size_t>(r.shard));
      // Gradients: the full bf16 flat buffer plus the widened f32 shard.
      CHECK(r.memory.grad_bytes == 2 * static_cast<size_t>(r.shard) * ranks + 4 * r.shard);
      sum += static_cast<int64_t>(r.memory.optimizer_bytes);
      moments += static_cast<int64_t>(r.state_bytes);
    }
    INFO(ranks << " ranks: " << total << " elements, optimizer bytes summed over ranks " << sum);
    CHECK(moments == 2 * 4 * total);
    CHECK(sum >= 3 * 4 * total);
    CHECK(sum <= 3 * 4 * total + 4 * padding);
    // Per rank: (2 + 1) x 4 bytes x total / N, within the padding.
    for (const RankResult& r : got) {
      CHECK(std::abs(static_cast<double>(r.memory.optimizer_bytes) - 12.0 * total / ranks) <=
            12.0 * padding);
    }
  }
}

TEST_CASE("zero master: mixed or integer dtypes fail at stages 1-3", "[zero]") {
  auto dp = comm::make_local_group(1, "dp");
  nn::Parameter low("low", Tensor::zeros({4}, DType::bf16));
  nn::Parameter full("full", Tensor::zeros({4}, DType::f32));
  nn::Parameter count("count", Tensor::zeros({4}, DType::i32));
  CHECK_THROWS_WITH(
      parallel::ZeroOptimizer({&low, &full}, *dp[0], optim::SgdOptions{}, {.stage = 1}),
      Catch::Contains("'full' is f32 but 'low' is bf16; stages 1 to 3 keep every parameter in "
                      "one flat buffer of one dtype"));
  CHECK_THROWS_WITH(parallel::ZeroOptimizer({&count}, *dp[0], optim::SgdOptions{}, {.stage = 2}),
                    Catch::Contains("'count' is i32; stages 1 to 3 shard floating-point"));
}
