#include "loom/parallel/grad_reducer.hpp"

#include <algorithm>
#include <limits>
#include <unordered_set>

#include "loom/core/error.hpp"
#include "loom/trace/profiler.hpp"
#include "parallel/control.hpp"
#include "parallel/grad_buckets.hpp"

namespace loom::parallel {

namespace {

// Gradient offsets inside a bucket start on 64-byte boundaries, so every
// gradient view is as aligned as a fresh allocation for vectorised kernels.
constexpr int64_t kAlignBytes = 64;

int64_t align_up(int64_t elements, size_t element_size) {
  const int64_t step = std::max<int64_t>(1, kAlignBytes / static_cast<int64_t>(element_size));
  return (elements + step - 1) / step * step;
}

DType wire_dtype(GradCompression compression) {
  return compression == GradCompression::bf16 ? DType::bf16 : DType::f16;
}

void validate(const std::vector<nn::Parameter*>& params, const ReducerOptions& options) {
  LOOM_CHECK(options.first_bucket_bytes >= 1, "ReducerOptions.first_bucket_bytes is ",
             options.first_bucket_bytes, "; it must be at least 1 (bytes of the first bucket)");
  LOOM_CHECK(options.bucket_cap_bytes >= 1, "ReducerOptions.bucket_cap_bytes is ",
             options.bucket_cap_bytes, "; it must be at least 1 (bytes per bucket)");
  LOOM_CHECK(options.compression == GradCompression::none ||
                 options.compression == GradCompression::bf16 ||
                 options.compression == GradCompression::f16,
             "ReducerOptions.compression is ", static_cast<int>(options.compression),
             "; it must be GradCompression::none, ::bf16 or ::f16");
  LOOM_CHECK(!params.empty(), "GradReducer: the parameter list is empty; pass model.parameters()");
  std::unordered_set<const nn::Parameter*> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    LOOM_CHECK(params[i] != nullptr, "GradReducer: parameter #", i, " is null");
    LOOM_CHECK(seen.insert(params[i]).second, "GradReducer: parameter '", params[i]->name(), "' (#",
               i, ") is listed twice; each parameter must appear once");
    LOOM_CHECK(params[i]->value().device() == params[0]->value().device(),
               "GradReducer: parameter '", params[i]->name(), "' is on ",
               params[i]->value().device().str(), " but '", params[0]->name(), "' is on ",
               params[0]->value().device().str(), "; a data-parallel replica lives on one device");
  }
}

}  // namespace

struct GradReducer::Bucket {
  DType dtype = DType::f32;
  Device device = Device::cpu();
  bool group_sum = false;        // holds parameters summed over tp / the embedding group first
  std::vector<size_t> params;    // parameter indices, in bucket order
  std::vector<int64_t> offsets;  // element offset of each parameter's gradient
  int64_t numel = 0;
  Tensor buffer;  // the flat gradients; each parameter's grad() is a view into it
  Tensor wire;    // half-precision copy that is reduced instead, when compressing
  bool launched = false;
  comm::Work work;
  int64_t launch_ns = 0;
};

GradReducer::GradReducer(std::vector<nn::Parameter*> params, comm::Communicator& dp,
                         const ReducerOptions& options)
    : params_(std::move(params)), comm_(dp), options_(options) {
  validate(params_, options_);
  control_device_ = params_[0]->value().device();
  engine_ = std::make_unique<detail::GradBuckets>("GradReducer", params_, comm_, options_.groups,
                                                  options_.unused,
                                                  [this](size_t bucket) { launch(bucket); });

  detail::check_parameter_agreement(comm_, params_, control_device_);
  if (options_.broadcast_parameters && comm_.size() > 1) {
    std::vector<comm::Work> works;
    works.reserve(params_.size());
    for (nn::Parameter* p : params_) works.push_back(comm_.broadcast(p->value(), {.root = 0}));
    comm::wait_all(works);
  }

  // Backward produces gradients roughly from the last layer to the first.
  std::vector<size_t> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
  build_buckets(order);
  engine_->set_observing(options_.rebuild_buckets);
  last_finish_end_ns_ = trace::now_ns();
}

GradReducer::~GradReducer() {
  engine_.reset();  // no more ready hooks
  // The backend uses the bucket buffers until the collectives finish.
  for (auto& bucket : buckets_) {
    if (!bucket->launched) continue;
    try {
      bucket->work.wait();
    } catch (const std::exception&) {
      // Already reported to whoever called finish(); nothing to add while unwinding.
    }
  }
}

// NOTE [bucket sizes]
// What is still being reduced when backward ends is exposed: the step waits
// for it. Filling buckets greedily up to the cap in ready order has two ways
// of leaving a lot for the end, and both rules below apply per dtype and
// device (a "kind"), the first bucket of a kind keeping first_bucket_bytes:
//  - Last bucket: whatever is left at the end of the order, up to a whole cap,
//    shares the bucket of the last gradient, so it can launch only when
//    backward is over (ResNet-18 at 2 CPU ranks: 25 MiB, 4-8 ms waited per
//    step). So the parameters that come last get a bucket of their own: the
//    longest run at the end of the order within last_bucket_bytes (and the
//    later-bucket cap), at least the last parameter whatever its size, never
//    the kind's first parameter, and none when the whole kind fits the first
//    bucket. last_bucket_bytes = 0 turns this off.
//  - Small models: a model below one cap fills a single later bucket that
//    launches with the last gradient (the benchmark GPT: 21 MiB, nothing
//    overlapped). So later buckets hold at most total / min_buckets when that
//    is below bucket_cap_bytes; models of min_buckets caps or more are not
//    affected. min_buckets <= 1 turns this off.
// With both off the buckets are PyTorch DDP's.
GradReducer::BucketPlan GradReducer::plan_buckets(const std::vector<size_t>& order) const {
  BucketPlan plan;
  plan.last.assign(params_.size(), false);
  auto bytes_of = [&](size_t i) {
    const size_t element = dtype_size(params_[i]->value().dtype());
    return static_cast<size_t>(align_up(params_[i]->value().numel(), element)) * element;
  };
  std::vector<bool> seen(params_.size(), false);
  for (size_t first = 0; first < order.size(); ++first) {
    if (seen[order[first]]) continue;
    const Tensor& value = params_[order[first]]->value();
    KindCaps kind{.dtype = value.dtype(),
                  .device = value.device(),
                  .group_sum = engine_->needs_group_sum(order[first])};
    std::vector<size_t> members;  // this kind's parameters, in `order`
    size_t total = 0;
    for (size_t k = first; k < order.size(); ++k) {
      const Tensor& v = params_[order[k]]->value();
      if (v.dtype() != kind.dtype || v.device() != kind.device ||
          engine_->needs_group_sum(order[k]) != kind.group_sum) {
        continue;
      }
      members.push_back(order[k]);
      seen[order[k]] = true;
      total += bytes_of(order[k]);
    }
    kind.later_cap = options_.bucket_cap_bytes;
    if (options_.min_buckets > 1) {
      const size_t share = (total + options_.min_buckets - 1) / options_.min_buckets;
      kind.later_cap = std::min(kind.later_cap, std::max<size_t>(share, 1));
    }
    plan.kinds.push_back(kind);
    if (options_.last_bucket_bytes == 0 || total <= options_.first_bucket_bytes) continue;
    const size_t last_cap = std::min(options_.last_bucket_bytes, kind.later_cap);
    size_t bytes = 0;
    for (size_t k = members.size() - 1; k >= 1; --k) {
      bytes += bytes_of(members[k]);
      if (k + 1 < members.size() && bytes > last_cap) break;
      plan.last[members[k]] = true;
    }
  }
  return plan;
}

void GradReducer::build_buckets(std::vector<size_t> order) {
  // NOTE [group sums] in grad_buckets.hpp: their buckets launch in finish(), so they go last.
  std::stable_partition(order.begin(), order.end(),
                        [&](size_t i) { return !engine_->needs_group_sum(i); });
  const BucketPlan plan = plan_buckets(order);
  std::vector<std::unique_ptr<Bucket>> built;
  std::vector<size_t> open;          // indices into `built` still accepting parameters
  std::vector<size_t> last_of_kind;  // NOTE [bucket sizes]: those created so far
  auto new_bucket = [&](DType dtype, Device device, bool group_sum, std::vector<size_t>& list) {
    auto bucket = std::make_unique<Bucket>();
    bucket->dtype = dtype;
    bucket->device = device;
    bucket->group_sum = group_sum;
    built.push_back(std::move(bucket));
    list.push_back(built.size() - 1);
    return list.end() - 1;
  };
  for (const size_t index : order) {
    const nn::Parameter& p = *params_[index];
    const DType dtype = p.value().dtype();
    const Device device = p.value().device();
    const bool group_sum = engine_->needs_group_sum(index);
    const size_t element = dtype_size(dtype);
    auto same_kind = [&](size_t b) {
      return built[b]->dtype == dtype && built[b]->device == device &&
             built[b]->group_sum == group_sum;
    };

    size_t target = 0;
    if (plan.last[index]) {
      // The kind's other parameters all came before (these are its last in `order`).
      auto slot = std::find_if(last_of_kind.begin(), last_of_kind.end(), same_kind);
      if (slot == last_of_kind.end()) slot = new_bucket(dtype, device, group_sum, last_of_kind);
      target = *slot;
    } else {
      auto slot = std::find_if(open.begin(), open.end(), same_kind);
      if (slot != open.end()) {
        const Bucket& b = *built[*slot];
        const auto first = std::find_if(built.begin(), built.end(), [&](const auto& other) {
          return other->dtype == dtype && other->device == device && other->group_sum == group_sum;
        });
        const size_t cap = first->get() == &b ? options_.first_bucket_bytes
                                              : plan.later_cap(dtype, device, group_sum);
        const size_t after = static_cast<size_t>(align_up(b.numel, element) + p.numel()) * element;
        if (after > cap) {
          open.erase(slot);
          slot = open.end();
        }
      }
      if (slot == open.end()) slot = new_bucket(dtype, device, group_sum, open);
      target = *slot;
    }
    Bucket& b = *built[target];
    const int64_t offset = align_up(b.numel, element);
    b.params.push_back(index);
    b.offsets.push_back(offset);
    b.numel = offset + p.numel();
  }

  // Buckets are numbered by their first parameter's position in `order`
  // (creation order), which is the order they are expected to fill.
  std::vector<std::vector<size_t>> members;
  for (size_t bi = 0; bi < built.size(); ++bi) {
    Bucket& b = *built[bi];
    // In memory the peers map where the backend can (NOTE [symmetric memory] in
    // comm/mpi: the all-reduce then works in place); collective, and every rank
    // builds the same buckets in the same order.
    b.buffer = comm_.allocate_symmetric({b.numel}, b.dtype, b.device);
    if (options_.compression != GradCompression::none && b.dtype == DType::f32) {
      b.wire = comm_.allocate_symmetric({b.numel}, wire_dtype(options_.compression), b.device);
    }
    for (size_t k = 0; k < b.params.size(); ++k) {
      nn::Parameter& p = *params_[b.params[k]];
      // Copies a gradient already written (a rebuild after the first step).
      p.set_grad_buffer(b.buffer.flat_view(b.offsets[k], p.shape()));
    }
    members.push_back(b.params);
  }
  buckets_ = std::move(built);
  engine_->set_buckets(std::move(members));
}

void GradReducer::launch(size_t index) {
  Bucket& b = *buckets_[index];
  b.launch_ns = trace::now_ns();
  Tensor payload = b.buffer;
  if (b.wire.defined()) {
    b.wire.copy_from(b.buffer);  // rounds to bf16/f16 on the current stream
    payload = b.wire;
  }
  // The hint is the same for every bucket on every rank (it may pick the algorithm).
  b.work = comm_.all_reduce(payload, {.op = comm::ReduceOp::avg, .overlaps_compute = true});
  b.launched = true;
}

void GradReducer::finish() {
  LOOM_CHECK(engine_->syncing(),
             "GradReducer::finish() called inside no_sync(); end the no_sync scope and run the "
             "last micro-batch's backward first");
  const int64_t start_ns = trace::now_ns();
  const int64_t first_ready_ns = engine_->first_ready_ns();
  engine_->launch_remaining();
  for (auto& bucket : buckets_) {
    bucket->work.block_stream(current_stream(bucket->device));
    bucket->work.wait();
    if (bucket->wire.defined()) bucket->buffer.copy_from(bucket->wire);
  }
  record_stats(start_ns, trace::now_ns(), first_ready_ns);
  for (auto& bucket : buckets_) {
    bucket->launched = false;
    bucket->work = comm::Work();
  }
  engine_->end_step();  // throws on every rank for an unused parameter under `error`
  if (options_.rebuild_buckets && rebuilds_ == 0) rebuild_from_observed_order();
  last_finish_end_ns_ = trace::now_ns();
}

void GradReducer::rebuild_from_observed_order() {
  // Parameters never seen (unused ones under zero_fill are seen) go last, in
  // the current bucket order.
  std::vector<int64_t> mine(engine_->observed_order().begin(), engine_->observed_order().end());
  for (const auto& bucket : buckets_) {
    for (const size_t index : bucket->params) {
      if (!engine_->observed(index)) mine.push_back(static_cast<int64_t>(index));
    }
  }
  const std::vector<int64_t> agreed =
      detail::broadcast_indices(comm_, std::move(mine), 0, control_device_);
  build_buckets(std::vector<size_t>(agreed.begin(), agreed.end()));
  rebuilds_ = 1;
  engine_->set_observing(false);
  engine_->clear_observed();
}

bool GradReducer::syncing() const {
  return engine_->syncing();
}

void GradReducer::set_last_micro_batch(const nn::Tape& tape) {
  engine_->set_final_micro_batch(tape.micro_batch());
}

std::vector<std::vector<std::string>> GradReducer::bucket_parameters() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& bucket : buckets_) {
    auto& names = out.emplace_back();
    for (const size_t index : bucket->params) names.push_back(params_[index]->name());
  }
  return out;
}

void GradReducer::record_stats(int64_t finish_start_ns, int64_t finish_end_ns,
                               int64_t first_ready_ns) {
  ReducerStats s;
  s.step = stats_.step + 1;
  std::vector<std::pair<int64_t, int64_t>> intervals;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = *buckets_[i];
    if (!b.launched) continue;
    const size_t bytes = b.wire.defined() ? b.wire.nbytes() : b.buffer.nbytes();
    const int64_t end_ns = b.launch_ns + static_cast<int64_t>(b.work.elapsed_seconds() * 1e9);
    intervals.emplace_back(b.launch_ns, end_ns);
    ++s.buckets;
    s.wire_bytes += bytes;
    trace::record_span("comm", "all_reduce bucket " + std::to_string(i), b.launch_ns, end_ns,
                       {{"bytes", static_cast<int64_t>(bytes)},
                        {"parameters", static_cast<int64_t>(b.params.size())},
                        {"step", s.step}});
  }
  // Wall time with at least one bucket in flight: the union of the intervals.
  std::sort(intervals.begin(), intervals.end());
  int64_t covered = 0, reach = std::numeric_limits<int64_t>::min();
  for (const auto& [begin, end] : intervals) {
    const int64_t from = std::max(begin, reach);
    if (end > from) covered += end - from;
    reach = std::max(reach, end);
  }
  s.comm_s = static_cast<double>(covered) * 1e-9;
  s.exposed_s = static_cast<double>(finish_end_ns - finish_start_ns) * 1e-9;
  s.compute_s = static_cast<double>(finish_start_ns - last_finish_end_ns_) * 1e-9;
  s.backward_s =
      first_ready_ns == 0 ? 0.0 : static_cast<double>(finish_start_ns - first_ready_ns) * 1e-9;
  s.hidden_fraction =
      s.comm_s > 0 ? std::clamp((s.comm_s - s.exposed_s) / s.comm_s, 0.0, 1.0) : 1.0;
  trace::record_span("comm", "finish (exposed communication)", finish_start_ns, finish_end_ns,
                     {{"step", s.step}, {"hidden_fraction", s.hidden_fraction}});
  stats_ = s;
}

GradReducer::NoSync::NoSync(GradReducer& reducer)
    : reducer_(reducer), previous_(reducer.engine_->syncing()) {
  reducer_.engine_->set_syncing(false);
}

GradReducer::NoSync::~NoSync() {
  reducer_.engine_->set_syncing(previous_);
}

}  // namespace loom::parallel
