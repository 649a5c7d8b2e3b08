// ZeroOptimizer: validation, construction of the flat layout and the
// optimizer over this rank's shard, and the public façade (zero.hpp). The
// gradient buckets are in zero_grads.cpp, stage 3's gathering in zero_gather.cpp.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <unordered_set>

#include "loom/core/error.hpp"
#include "loom/core/logging.hpp"
#include "loom/core/stream.hpp"
#include "loom/parallel/grad_clip.hpp"
#include "loom/parallel/zero.hpp"
#include "parallel/control.hpp"
#include "parallel/zero_impl.hpp"

namespace loom::parallel {

namespace {

std::unique_ptr<optim::Optimizer> make_optimizer(std::vector<optim::ParamSlot> slots,
                                                 const OptimizerOptions& options) {
  if (const auto* sgd = std::get_if<optim::SgdOptions>(&options)) {
    return std::make_unique<optim::SGD>(std::move(slots), *sgd);
  }
  return std::make_unique<optim::AdamW>(std::move(slots), std::get<optim::AdamWOptions>(options));
}

void validate(const std::vector<nn::Parameter*>& params, const ZeroOptions& options) {
  LOOM_CHECK(options.stage >= 0 && options.stage <= 3, "ZeroOptions.stage is ", options.stage,
             "; it must be 0 (plain data parallelism), 1 (optimizer state sharded), 2 (+ "
             "gradients) or 3 (+ parameters)");
  LOOM_CHECK(options.compression == GradCompression::none ||
                 options.compression == GradCompression::bf16 ||
                 options.compression == GradCompression::f16,
             "ZeroOptions.compression is ", static_cast<int>(options.compression),
             "; it must be GradCompression::none, ::bf16 or ::f16");
  LOOM_CHECK(options.first_bucket_bytes >= 1 && options.bucket_cap_bytes >= 1,
             "ZeroOptions bucket caps are ", options.first_bucket_bytes, " and ",
             options.bucket_cap_bytes, " bytes; both must be at least 1");
  LOOM_CHECK(!params.empty(),
             "ZeroOptimizer: the parameter list is empty; pass model.parameters()");
  std::unordered_set<const nn::Parameter*> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    LOOM_CHECK(params[i] != nullptr, "ZeroOptimizer: parameter #", i, " is null");
    LOOM_CHECK(seen.insert(params[i]).second, "ZeroOptimizer: parameter '", params[i]->name(),
               "' (#", i, ") is listed twice; each parameter must appear once");
    LOOM_CHECK(params[i]->device() == params[0]->device(), "ZeroOptimizer: parameter '",
               params[i]->name(), "' is on ", params[i]->device().str(), " but '",
               params[0]->name(), "' is on ", params[0]->device().str(),
               "; a data-parallel replica lives on one device");
    if (options.stage == 0) continue;
    LOOM_CHECK(is_floating(params[i]->dtype()), "ZeroOptimizer: parameter '", params[i]->name(),
               "' is ", dtype_name(params[i]->dtype()),
               "; stages 1 to 3 shard floating-point parameters (f32, bf16, f16)");
    LOOM_CHECK(params[i]->dtype() == params[0]->dtype(), "ZeroOptimizer: parameter '",
               params[i]->name(), "' is ", dtype_name(params[i]->dtype()), " but '",
               params[0]->name(), "' is ", dtype_name(params[0]->dtype()),
               "; stages 1 to 3 keep every parameter in one flat buffer of one dtype");
  }
  if (options.replicas != nullptr) {
    LOOM_CHECK(options.stage >= 1,
               "ZeroOptimizer: ZeroOptions.replicas (hybrid sharding) is set "
               "at stage 0; it needs stage 1, 2 or 3 (at stage 0 nothing is sharded: pass the "
               "whole data-parallel group as dp)");
  }
  if (options.overlap_param_gather && (options.stage == 1 || options.stage == 2)) {
    LOOM_CHECK(!options.modules.empty(),
               "ZeroOptimizer: ZeroOptions.overlap_param_gather at stage ", options.stage,
               " needs ZeroOptions.modules, the parallel::ShardedModule wrappers whose forward "
               "waits for their own parameters' all-gather (e.g. shard_children(gpt.blocks()) "
               "plus a ShardedModule around the whole model)");
  }
  if (options.stage == 3 || (options.overlap_param_gather && options.stage > 0)) {
    for (size_t j = 0; j < options.modules.size(); ++j) {
      LOOM_CHECK(options.modules[j] != nullptr, "ZeroOptimizer: ZeroOptions.modules[", j,
                 "] is null");
    }
  }
  if (options.stage == 3) {
    LOOM_CHECK(!options.modules.empty(),
               "ZeroOptimizer: stage 3 needs ZeroOptions.modules, the parallel::ShardedModule "
               "wrappers that gather parameters around their forward and backward (e.g. "
               "shard_children(gpt.blocks()) plus a ShardedModule around the whole model)");
  }
}

}  // namespace

std::string MemoryStats::summary() const {
  auto mib = [](size_t bytes) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
    return std::string(text);
  };
  return str_cat("params ", mib(param_bytes), ", grads ", mib(grad_bytes), ", optimizer ",
                 mib(optimizer_bytes), ", peak ", mib(peak_bytes));
}

ZeroOptimizer::Impl::Impl(std::vector<nn::Parameter*> list, comm::Communicator& dp,
                          const OptimizerOptions& optimizer, const ZeroOptions& zero)
    : params(std::move(list)), comm(dp), options(zero) {
  validate(params, options);
  device = params[0]->device();
  dtype = params[0]->dtype();
  element = dtype_size(dtype);
  stage = options.stage;
  if (options.replicas != nullptr) {
    // Every rank checks the same numbers, so all of them throw together.
    LOOM_CHECK(comm.size() >= 2, "ZeroOptimizer: hybrid sharding over a shard group of ",
               comm.size(), " rank shards nothing; use stage ", stage,
               " over the whole data-parallel group (dp) without ZeroOptions.replicas");
  }
  if (stage > 0 && comm.size() == 1) {
    LOOM_LOG_INFO("ZeroOptimizer: the data-parallel group has one rank; stage ", stage,
                  " shards nothing and runs as stage 0");
    stage = 0;
  }
  std::vector<size_t> unit_of(params.size(), 0);
  if (stage == 3) unit_of = assign_units(/*everywhere=*/true);

  std::vector<optim::ParamSlot> decay = optim::param_slots(params, options.decay);
  if (stage == 0) {
    reducer = std::make_unique<GradReducer>(
        params, comm,
        ReducerOptions{.first_bucket_bytes = options.first_bucket_bytes,
                       .bucket_cap_bytes = options.bucket_cap_bytes,
                       .unused = options.unused,
                       .compression = options.compression,
                       .broadcast_parameters = options.broadcast_parameters,
                       .groups = options.groups});
    opt = make_optimizer(std::move(decay), optimizer);
    for (const nn::Parameter* p : params) {
      param_bytes += static_cast<int64_t>(p->numel() * element);
    }
    grad_bytes = param_bytes;  // the reducer's buckets (without their alignment padding)
    optimizer_bytes = static_cast<int64_t>(opt->state_bytes());
    track(0, 0);
    return;
  }

  engine = std::make_unique<detail::GradBuckets>("ZeroOptimizer", params, comm, options.groups,
                                                 options.unused,
                                                 [this](size_t bucket) { launch(bucket); });
  std::vector<bool> group_sum(params.size());
  for (size_t i = 0; i < params.size(); ++i) group_sum[i] = engine->needs_group_sum(i);
  comm::Communicator* replicas = options.replicas;
  detail::check_parameter_agreement(comm, params, device);
  if (replicas) detail::check_parameter_agreement(*replicas, params, device);
  layout = detail::build_zero_layout(params, unit_of, group_sum, comm.size(), element,
                                     options.first_bucket_bytes, options.bucket_cap_bytes);
  detail::check_layout_agreement(comm, layout.describe(params), device);
  // Hybrid sharding: the replicas hold the same shard, so their layouts
  // (and the shard groups' sizes) must agree too.
  if (replicas) detail::check_layout_agreement(*replicas, layout.describe(params), device);
  if (options.broadcast_parameters) {
    // Rank 0 of each shard group, then replica 0 of each place: every rank
    // ends with the values of the first shard group's rank 0.
    for (comm::Communicator* group : {&comm, replicas}) {
      if (group == nullptr) continue;
      std::vector<comm::Work> works;
      for (nn::Parameter* p : params) works.push_back(group->broadcast(p->value(), {.root = 0}));
      comm::wait_all(works);
    }
  }
  mine = layout.shard_of(comm.rank());
  const auto shard_bytes = static_cast<int64_t>(layout.shard * element);

  if (stage < 3) {
    flat_value = Tensor::zeros({layout.total}, dtype, device);
    for (const auto& e : layout.entries) {
      params[e.param]->set_value_buffer(flat_value.flat_view(e.offset, params[e.param]->shape()));
    }
    track(static_cast<int64_t>(flat_value.nbytes()), 0);
  } else {
    shard_value = Tensor::zeros({layout.shard}, dtype, device);
    for (const auto& e : layout.entries) {
      const Range piece = detail::intersect(e.range(), mine);
      if (piece.size() == 0) continue;
      flat_range(shard_value, {piece.begin - mine.begin, piece.end - mine.begin})
          .copy_from(flat_range(params[e.param]->value().flatten(),
                                {piece.begin - e.offset, piece.end - e.offset}));
    }
    for (nn::Parameter* p : params) p->release_value();
    track(shard_bytes, 0);
    units.resize(layout.units.size());
    for (size_t j = 0; j < options.modules.size(); ++j) unit_of_module[options.modules[j]] = -1;
    for (size_t i = 0; i < params.size(); ++i) {
      unit_of_module[options.modules[unit_of[i]]] =
          static_cast<long>(layout.entries[layout.entry_of[i]].unit);
    }
    for (ShardedModule* m : options.modules) m->attach(this);
    // NOTE [prefetch budget]: prefetching never makes the gathered units
    // exceed the two largest units together.
    std::vector<int64_t> sizes;
    for (const auto& unit : layout.units) sizes.push_back(unit.range.size());
    std::sort(sizes.begin(), sizes.end(), std::greater<>());
    for (size_t i = 0; i < std::min<size_t>(2, sizes.size()); ++i) prefetch_budget += sizes[i];
  }

  if (stage == 1) {
    // The buckets are slices at the same offsets on every rank: in symmetric
    // memory the backend can all-reduce them in place (NOTE [symmetric memory]).
    flat_grad = comm.allocate_symmetric({layout.total}, dtype, device);
    for (const auto& e : layout.entries) {
      params[e.param]->set_grad_buffer(flat_grad.flat_view(e.offset, params[e.param]->shape()));
    }
    track(0, static_cast<int64_t>(flat_grad.nbytes()));
  } else {
    shard_grad = Tensor::zeros({layout.shard}, dtype, device);
    track(0, shard_bytes);
  }

  buckets.resize(layout.buckets.size());
  bucket_of.assign(params.size(), 0);
  std::vector<std::vector<size_t>> members;
  for (size_t b = 0; b < layout.buckets.size(); ++b) {
    for (const size_t i : layout.buckets[b].params) bucket_of[i] = b;
    members.push_back(layout.buckets[b].params);
    if (stage == 1) buckets[b].buffer = flat_range(flat_grad, layout.buckets[b].range);
  }
  engine->set_buckets(std::move(members));
  if (stage == 1 || stage == 2) {
    const size_t gathers = overlapping_gather() ? buckets.size() : 1;
    param_gathers.resize(gathers);
    gather_pending.assign(gathers, false);
    if (overlapping_gather()) plan_gather_buckets();
  }
  if (stage >= 2) {
    for (size_t i = 0; i < params.size(); ++i) {
      params[i]->release_grad();
      params[i]->set_grad_provider([this, i](nn::Parameter&) { return grad_view(i); });
    }
  }

  if (dtype != DType::f32) {
    // See NOTE [fp32 master]: the master starts as the (broadcast) values, widened.
    master = Tensor::empty({layout.shard}, DType::f32, device);
    master.copy_from(low_value_shard());
    master_grad = Tensor::zeros({layout.shard}, DType::f32, device);
    optimizer_bytes += static_cast<int64_t>(master.nbytes());
    track(0, static_cast<int64_t>(master_grad.nbytes()));
  }

  // Optimizer slots: the pieces of this rank's shard, one per parameter it touches.
  std::vector<optim::ParamSlot> slots;
  slot_params.clear();
  for (const auto& e : layout.entries) {
    const Range piece = detail::intersect(e.range(), mine);
    if (piece.size() == 0) continue;
    const Range local{piece.begin - mine.begin, piece.end - mine.begin};
    Tensor value, grad;
    if (master.defined()) {
      value = flat_range(master, local);
      grad = flat_range(master_grad, local);
    } else {
      value = stage == 3 ? flat_range(shard_value, local) : flat_range(flat_value, piece);
      grad = stage == 1 ? flat_range(flat_grad, piece) : flat_range(shard_grad, local);
    }
    slot_params.push_back(params[e.param]);
    slots.push_back(
        optim::ParamSlot::buffer(str_cat(params[e.param]->name(), "[", piece.begin - e.offset, ":",
                                         piece.end - e.offset, "]"),
                                 value, grad, decay[e.param].weight_decay));
  }
  opt = make_optimizer(std::move(slots), optimizer);
  optimizer_bytes += static_cast<int64_t>(opt->state_bytes());
  track(0, 0);
}

void ZeroOptimizer::Impl::set_syncing(bool syncing) {
  if (reducer) {
    // GradReducer's NoSync is a scope; flip it the same way through one.
    if (!syncing && !reducer_no_sync) reducer_no_sync.emplace(*reducer);
    if (syncing) reducer_no_sync.reset();
  } else {
    engine->set_syncing(syncing);
  }
}

ZeroOptimizer::Impl::~Impl() {
  engine.reset();  // no more ready hooks
  if (stage >= 2) {
    for (nn::Parameter* p : params) p->set_grad_provider({});
  }
  for (ShardedModule* m : options.modules) m->attach(nullptr);
  // The backend uses these buffers until the operations finish.
  auto quiet_wait = [](const comm::Work& work) {
    try {
      work.wait();
    } catch (const std::exception&) {
      // Already reported to whoever waited first; nothing to add while unwinding.
    }
  };
  for (const Bucket& b : buckets) {
    quiet_wait(b.work);
    quiet_wait(b.replica_work);
  }
  for (const Unit& u : units) quiet_wait(u.work);
  for (const comm::Work& w : param_gathers) quiet_wait(w);
}

ZeroOptimizer::ZeroOptimizer(std::vector<nn::Parameter*> params, comm::Communicator& dp,
                             const OptimizerOptions& optimizer, const ZeroOptions& options)
    : impl_(std::make_unique<Impl>(std::move(params), dp, optimizer, options)), options_(options) {}

ZeroOptimizer::~ZeroOptimizer() = default;

void ZeroOptimizer::zero_grad() {
  impl_->wait_unowned_parameters();
  if (impl_->stage == 0) {
    impl_->opt->zero_grad();
    return;
  }
  for (nn::Parameter* p : impl_->params) p->zero_grad();
}

void ZeroOptimizer::finish() {
  const auto start = std::chrono::steady_clock::now();
  if (impl_->stage == 0) {
    impl_->reducer->finish();
  } else {
    impl_->finish();
  }
  impl_->waits.reduction_wait_s += seconds_since(start);
  ++impl_->waits.steps;
}

double ZeroOptimizer::clip_grad_norm(double max_norm, double grad_scale) {
  if (impl_->stage == 0) {
    return parallel::clip_grad_norm(impl_->params, options_.groups, max_norm, grad_scale);
  }
  const std::vector<Tensor> grads = grad_shards();
  std::vector<GradPiece> pieces;
  pieces.reserve(grads.size());
  for (size_t k = 0; k < grads.size(); ++k) pieces.push_back({impl_->slot_params[k], grads[k]});
  return parallel::clip_grad_norm(pieces, options_.groups, max_norm, &impl_->comm, grad_scale);
}

const std::vector<nn::Parameter*>& ZeroOptimizer::parameters() const {
  return impl_->params;
}

int ZeroOptimizer::data_parallel_size() const {
  return impl_->comm.size();
}

int ZeroOptimizer::replica_count() const {
  return impl_->options.replicas ? impl_->options.replicas->size() : 1;
}

int ZeroOptimizer::replica_rank() const {
  return impl_->options.replicas ? impl_->options.replicas->rank() : 0;
}

ZeroGroups hybrid_shard_groups(comm::Communicator& dp, int shard_size) {
  LOOM_CHECK(shard_size >= 2 && shard_size < dp.size() && dp.size() % shard_size == 0,
             "hybrid sharding: a shard group of ", shard_size,
             " rank(s) in a data-parallel group "
             "of ",
             dp.size(),
             "; the shard group must have at least 2 ranks, fewer than the "
             "group's ",
             dp.size(), ", and divide it");
  const int rank = dp.rank();
  ZeroGroups groups;
  groups.shard = dp.split(rank / shard_size, rank, str_cat(dp.name(), ".shard"));
  groups.replicas = dp.split(rank % shard_size, rank, str_cat(dp.name(), ".replicas"));
  return groups;
}

std::vector<ShardPiece> ZeroOptimizer::shard_pieces(int rank) const {
  const Impl& z = *impl_;
  LOOM_CHECK(rank >= 0 && rank < z.comm.size(), "ZeroOptimizer::shard_pieces: rank ", rank,
             " is not in the data-parallel group of ", z.comm.size());
  std::vector<ShardPiece> out;
  if (z.stage == 0) {
    for (nn::Parameter* p : z.params) out.push_back({p, 0, p->numel()});
    return out;
  }
  const detail::Range shard = z.layout.shard_of(rank);
  for (const auto& e : z.layout.entries) {
    const detail::Range piece = detail::intersect(e.range(), shard);
    if (piece.size() == 0) continue;
    out.push_back({z.params[e.param], piece.begin - e.offset, piece.end - e.offset});
  }
  return out;
}

std::vector<Tensor> ZeroOptimizer::value_shards() const {
  const Impl& z = *impl_;
  std::vector<Tensor> out;
  if (z.stage == 0) {
    for (nn::Parameter* p : z.params) out.push_back(p->value().flat_view(0, {p->numel()}));
    return out;
  }
  for (const auto& e : z.layout.entries) {
    const detail::Range piece = detail::intersect(e.range(), z.mine);
    if (piece.size() == 0) continue;
    const detail::Range local{piece.begin - z.mine.begin, piece.end - z.mine.begin};
    out.push_back(z.stage == 3 ? Impl::flat_range(z.shard_value, local)
                               : Impl::flat_range(z.flat_value, piece));
  }
  return out;
}

void ZeroOptimizer::step() {
  for (const nn::Parameter* p : impl_->params)
    p->check_reduction_finished("ZeroOptimizer::step", "ZeroOptimizer");
  if (impl_->stage == 0) {
    impl_->opt->step();
  } else {
    impl_->step();
  }
}

void ZeroOptimizer::wait_parameters() {
  impl_->wait_parameters();
}

void ZeroOptimizer::gather_parameters() {
  wait_parameters();
  for (size_t u = 0; u < impl_->units.size(); ++u) {
    impl_->complete_gather(u);
    ++impl_->units[u].uses;
  }
}

void ZeroOptimizer::release_parameters() {
  for (size_t u = 0; u < impl_->units.size(); ++u) {
    LOOM_CHECK(impl_->units[u].uses > 0,
               "ZeroOptimizer::release_parameters() without gather_parameters()");
    if (--impl_->units[u].uses == 0) impl_->release_unit(u);
  }
}

ZeroOptimizer::NoSync::NoSync(ZeroOptimizer& zero) : zero_(zero), previous_(zero.impl_->syncing()) {
  zero_.impl_->set_syncing(false);
}

ZeroOptimizer::NoSync::~NoSync() {
  zero_.impl_->set_syncing(previous_);
}

void ZeroOptimizer::set_last_micro_batch(const nn::Tape& tape) {
  if (impl_->reducer) {
    impl_->reducer->set_last_micro_batch(tape);
  } else {
    impl_->engine->set_final_micro_batch(tape.micro_batch());
  }
}

int ZeroOptimizer::stage() const {
  return impl_->stage;
}

const GradReducer* ZeroOptimizer::reducer() const {
  return impl_->reducer.get();
}

optim::Optimizer& ZeroOptimizer::optimizer() {
  return *impl_->opt;
}

std::vector<Tensor> ZeroOptimizer::grad_shards() const {
  return impl_->opt->grads();
}

MemoryStats ZeroOptimizer::memory() const {
  return {.param_bytes = static_cast<size_t>(impl_->param_bytes),
          .grad_bytes = static_cast<size_t>(impl_->grad_bytes),
          .optimizer_bytes = static_cast<size_t>(impl_->optimizer_bytes),
          .peak_bytes = static_cast<size_t>(impl_->peak),
          .peak_param_bytes = static_cast<size_t>(impl_->peak_params),
          .peak_grad_bytes = static_cast<size_t>(impl_->peak_grads)};
}

ZeroWaitStats ZeroOptimizer::wait_stats() const {
  return impl_->waits;
}

int64_t ZeroOptimizer::shard_numel() const {
  return impl_->stage == 0 ? 0 : impl_->layout.shard;
}

}  // namespace loom::parallel
