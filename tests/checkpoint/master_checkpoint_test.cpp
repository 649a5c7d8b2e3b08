// Checkpoints of bf16/f16 parameters whose f32 masters ZeroOptimizer keeps at
// stages 1 to 3 (NOTE [master records] in src/checkpoint/distributed.cpp), on
// in-process ranks. The parameters live in modules that only own them; the
// test writes deterministic gradients (as tests/parallel/zero_master_test.cpp)
// and steps AdamW through ZeroOptimizer.
//  - Resumed on the saving layout, a run continues bit for bit: values,
//    masters and moments equal the uninterrupted run's after 3 more steps.
//  - Loaded under another dp size and ZeRO stage, every rank holds exactly
//    the saved masters, values and moments (one rank, where ZeroOptimizer
//    runs stage 0 and keeps no masters: the values and moments).
//  - An f32 model takes a low-precision run's masters as its values; a
//    low-precision model takes an f32 run's values as its masters (rounded
//    for its values), and one saved without masters (stage 0) starts its
//    masters from the values, as ZeroOptimizer does.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "loom/checkpoint/distributed.hpp"
#include "loom/comm/local.hpp"
#include "loom/core/error.hpp"
#include "loom/core/half.hpp"
#include "loom/parallel/sharded_module.hpp"
#include "loom/parallel/zero.hpp"
#include "support/param_bag.hpp"

using namespace loom;
namespace fs = std::filesystem;

namespace {

struct Layout {
  int ranks = 2;
  int stage = 1;
  DType dtype = DType::bf16;
};

struct Segment {
  int first = 0, last = 0;  // steps [first, last)
  fs::path save_dir = {};   // save after step `save_after` when set
  int save_after = -1;
  fs::path resume_from = {};  // a step directory to load before training
};

// Whole tensors, per parameter, assembled from every rank's pieces.
struct State {
  std::vector<std::vector<float>> values;   // widened
  std::vector<std::vector<float>> masters;  // the f32 masters; the values where none is kept
  std::vector<std::vector<float>> exp_avg;  // AdamW's first moment
};

// One rank's pieces: (parameter, first element, elements).
struct Piece {
  size_t param = 0;
  int64_t begin = 0;
  std::vector<float> data;
};
struct RankPieces {
  std::vector<std::vector<float>> values;
  std::vector<Piece> masters, exp_avg;
};

// "<parameter>[b:e]" (stages 1-3) or "<parameter>" (stage 0): the parameter's index and b.
std::pair<size_t, int64_t> slot_place(const std::string& slot,
                                      const std::vector<nn::Parameter*>& params) {
  const size_t open = slot.rfind('[');
  const std::string name = open == std::string::npos ? slot : slot.substr(0, open);
  const int64_t begin = open == std::string::npos ? 0 : std::stoll(slot.substr(open + 1));
  for (size_t j = 0; j < params.size(); ++j) {
    if (params[j]->name() == name) return {j, begin};
  }
  throw Error(str_cat("optimizer slot '", slot, "' names no parameter"));
}

RankPieces run_rank(const Layout& l, const Segment& seg, comm::Communicator& c) {
  std::vector<std::vector<float>> init;
  for (size_t j = 0; j < test::kBagParams; ++j) init.push_back(test::bag_initial(j));
  parallel::ShardedModule a(std::make_unique<test::ParamBag>(
      "a", test::kBagSizesA, std::vector<std::vector<float>>(init.begin(), init.begin() + 3),
      l.dtype));
  parallel::ShardedModule b(std::make_unique<test::ParamBag>(
      "b", test::kBagSizesB, std::vector<std::vector<float>>(init.begin() + 3, init.end()),
      l.dtype));
  std::vector<nn::Parameter*> params = a.parameters();
  for (nn::Parameter* p : b.parameters()) params.push_back(p);
  std::vector<parallel::ShardedModule*> units;
  if (l.stage == 3) units = {&a, &b};
  parallel::ZeroOptimizer zero(
      params, c, optim::AdamWOptions{.lr = 0.01, .weight_decay = 0.1},
      {.stage = l.stage, .first_bucket_bytes = 96, .bucket_cap_bytes = 128, .modules = units});
  if (!seg.resume_from.empty()) {
    const checkpoint::TrainingState state =
        checkpoint::load_checkpoint(seg.resume_from, zero, c.rank(), c);
    LOOM_CHECK(state.step == seg.first, "resumed at step ", state.step, ", expected ", seg.first);
  }
  for (int t = seg.first; t < seg.last; ++t) {
    zero.zero_grad();
    for (size_t j = test::kBagParams; j-- > 0;) {  // backward order
      std::vector<float> g(static_cast<size_t>(test::bag_size(j)));
      for (size_t k = 0; k < g.size(); ++k) g[k] = test::bag_gradient(c.rank(), t, j, k);
      nn::Parameter::GradWrite w = params[j]->begin_grad_write();
      w.grad.copy_from(Tensor::from_vector(g, {test::bag_size(j)}));
      params[j]->end_grad_write();
    }
    zero.finish();
    zero.step();
    if (t == seg.save_after) {
      checkpoint::save_checkpoint(seg.save_dir, c, zero, {.step = t + 1}, {.dp_rank = c.rank()});
    }
  }
  RankPieces out;
  zero.gather_parameters();
  for (nn::Parameter* p : params) out.values.push_back(p->value().to_vector<float>());
  zero.release_parameters();
  for (const optim::ParamSlot& slot : zero.optimizer().slots()) {
    const auto [j, begin] = slot_place(slot.name, params);
    out.masters.push_back({j, begin, slot.current_value().to_vector<float>()});
  }
  for (const optim::Optimizer::StateTensor& s : zero.optimizer().state()) {
    const std::string suffix = ".exp_avg";
    if (s.name.size() < suffix.size() ||
        s.name.compare(s.name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const auto [j, begin] = slot_place(s.name.substr(0, s.name.size() - suffix.size()), params);
    out.exp_avg.push_back({j, begin, s.tensor.to_vector<float>()});
  }
  return out;
}

bool keeps_masters(const Layout& l) {
  return l.ranks > 1 && l.stage > 0 && l.dtype != DType::f32;
}

State run(const Layout& l, const Segment& seg) {
  std::vector<RankPieces> ranks(static_cast<size_t>(l.ranks));
  comm::run_local_ranks(comm::make_local_group(l.ranks), [&](comm::Communicator& c) {
    ranks[static_cast<size_t>(c.rank())] = run_rank(l, seg, c);
  });
  State s;
  s.values = ranks[0].values;
  s.masters = s.values;  // overwritten piece by piece below where masters are kept
  s.exp_avg.assign(test::kBagParams, {});
  for (size_t j = 0; j < test::kBagParams; ++j)
    s.exp_avg[j].assign(static_cast<size_t>(test::bag_size(j)), NAN);
  // One rank runs ZeRO's stage 0 whatever was asked: no masters then.
  const bool masters = keeps_masters(l);
  for (const RankPieces& r : ranks) {
    for (const Piece& p : r.exp_avg)
      std::copy(p.data.begin(), p.data.end(), s.exp_avg[p.param].begin() + p.begin);
    if (!masters) continue;
    for (const Piece& p : r.masters)
      std::copy(p.data.begin(), p.data.end(), s.masters[p.param].begin() + p.begin);
  }
  return s;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("loom_master_ckpt_" + name);
  fs::remove_all(dir);
  return dir;
}

}  // namespace

TEST_CASE("bf16 and f16 parameters with f32 masters resume bit for bit at ZeRO stages 1 to 3",
          "[checkpoint]") {
  for (const Layout l : {Layout{2, 1, DType::bf16}, Layout{2, 2, DType::f16},
                         Layout{2, 3, DType::bf16}, Layout{3, 3, DType::bf16}}) {
    INFO(l.ranks << " ranks, ZeRO stage " << l.stage << ", " << l.dtype);
    const fs::path dir = fresh_dir("resume");
    const State whole = run(l, {.first = 0, .last = 6, .save_dir = dir, .save_after = 2});
    const State saved = run(l, {.first = 0, .last = 3});
    // The masters carry what the values lost: a checkpoint of the values alone would not do.
    CHECK(saved.masters != saved.values);
    const checkpoint::CheckpointReader reader(dir / "step-00000003");
    const std::vector<std::string>& kinds = reader.params().at("a.w").kinds;
    CHECK(std::find(kinds.begin(), kinds.end(), "master") != kinds.end());
    const State resumed = run(l, {.first = 3, .last = 6, .resume_from = dir / "step-00000003"});
    CHECK(resumed.values == whole.values);
    CHECK(resumed.masters == whole.masters);
    CHECK(resumed.exp_avg == whole.exp_avg);
    fs::remove_all(dir);
  }
}

TEST_CASE("f32 masters reshard: loaded under another dp size and ZeRO stage, exactly as saved",
          "[checkpoint]") {
  const fs::path dir = fresh_dir("reshard");
  const Layout saver{2, 3, DType::bf16};
  const State saved = run(saver, {.first = 0, .last = 3, .save_dir = dir, .save_after = 2});
  for (const Layout l : {Layout{1, 1, DType::bf16}, Layout{2, 2, DType::bf16},
                         Layout{4, 3, DType::bf16}, Layout{3, 1, DType::bf16}}) {
    INFO("loaded on " << l.ranks << " ranks at ZeRO stage " << l.stage);
    const State loaded = run(l, {.first = 3, .last = 3, .resume_from = dir / "step-00000003"});
    CHECK(loaded.values == saved.values);
    if (keeps_masters(l)) CHECK(loaded.masters == saved.masters);
    CHECK(loaded.exp_avg == saved.exp_avg);
  }
  fs::remove_all(dir);
}

TEST_CASE("precision changes across a checkpoint: masters become values and values masters",
          "[checkpoint]") {
  const fs::path dir = fresh_dir("precision");
  const fs::path step = dir / "step-00000003";
  SECTION("an f32 model takes a bf16 run's masters as its values") {
    const State saved =
        run({2, 2, DType::bf16}, {.first = 0, .last = 3, .save_dir = dir, .save_after = 2});
    const State loaded = run({2, 1, DType::f32}, {.first = 3, .last = 3, .resume_from = step});
    CHECK(loaded.values == saved.masters);
  }
  SECTION("a bf16 model takes an f32 run's values as masters and their rounding as values") {
    const State saved =
        run({2, 1, DType::f32}, {.first = 0, .last = 3, .save_dir = dir, .save_after = 2});
    const State loaded = run({2, 3, DType::bf16}, {.first = 3, .last = 3, .resume_from = step});
    CHECK(loaded.masters == saved.values);
    std::vector<std::vector<float>> rounded = saved.values;
    for (auto& v : rounded) {
      for (float& x : v) x = test::round_to(DType::bf16, x);
    }
    CHECK(loaded.values == rounded);
  }
  SECTION("a bf16 run saved at stage 0 (no masters) starts its masters from the values") {
    const State saved =
        run({2, 0, DType::bf16}, {.first = 0, .last = 3, .save_dir = dir, .save_after = 2});
    const checkpoint::CheckpointReader reader(step);
    const std::vector<std::string>& kinds = reader.params().at("a.w").kinds;
    CHECK(std::find(kinds.begin(), kinds.end(), "master") == kinds.end());
    const State loaded = run({2, 3, DType::bf16}, {.first = 3, .last = 3, .resume_from = step});
    CHECK(loaded.values == saved.values);
    CHECK(loaded.masters == saved.values);
  }
  fs::remove_all(dir);
}
