#include "parallel/grad_buckets.hpp"

#include <algorithm>
#include <limits>
#include <numeric>

#include "loom/core/error.hpp"
#include "loom/trace/profiler.hpp"
#include "parallel/control.hpp"

namespace loom::parallel::detail {

namespace {

constexpr int64_t kNone = std::numeric_limits<int64_t>::max();

bool wider_than_one(const comm::Communicator* group) {
  return group != nullptr && group->size() > 1;
}

}  // namespace

GradBuckets::GradBuckets(std::string owner, std::vector<nn::Parameter*> params,
                         comm::Communicator& dp, const ReductionGroups& groups,
                         UnusedParameters unused, Launch launch)
    : owner_(std::move(owner)),
      params_(std::move(params)),
      dp_(dp),
      groups_(groups),
      unused_(unused),
      launch_(std::move(launch)),
      first_unused_(kNone) {
  LOOM_CHECK(unused_ == UnusedParameters::error || unused_ == UnusedParameters::zero_fill, owner_,
             ": the unused-parameter policy is ", static_cast<int>(unused_),
             "; it must be UnusedParameters::error or ::zero_fill");
  control_device_ = params_.empty() ? Device::cpu() : params_[0]->device();
  group_sum_.assign(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i) {
    const nn::Placement& placement = params_[i]->placement();
    LOOM_CHECK(!placement.sum_grad_over_tp || groups_.tp != nullptr, owner_, ": parameter '",
               params_[i]->name(),
               "' asks for its gradient to be summed over the tensor-parallel group "
               "(Placement.sum_grad_over_tp) but no tp group was given; pass "
               "reduction_groups(parallel_groups) in the options");
    LOOM_CHECK(!placement.tied_across_stages || groups_.embedding != nullptr, owner_,
               ": parameter '", params_[i]->name(),
               "' is a copy of a weight tied across pipeline stages "
               "(Placement.tied_across_stages) but no embedding group was given; pass "
               "reduction_groups(parallel_groups) in the options, or tie the copies into one "
               "Parameter when both ends live on this rank");
    group_sum_[i] = (placement.sum_grad_over_tp && wider_than_one(groups_.tp)) ||
                    (placement.tied_across_stages && wider_than_one(groups_.embedding));
  }
  ready_.assign(params_.size(), false);
  observed_.assign(params_.size(), false);
  hook_ids_.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    hook_ids_.push_back(params_[i]->add_ready_hook(
        [this, i](nn::Parameter&, uint64_t micro_batch) { on_ready(i, micro_batch); }));
  }
}

GradBuckets::~GradBuckets() {
  for (size_t i = 0; i < hook_ids_.size(); ++i) {
    params_[i]->remove_ready_hook(hook_ids_[i]);
    if (params_[i]->reduction_pending() == owner_.c_str())
      params_[i]->set_reduction_pending(nullptr);
  }
}

void GradBuckets::set_buckets(std::vector<std::vector<size_t>> members) {
  members_ = std::move(members);
  bucket_of_.assign(params_.size(), std::numeric_limits<size_t>::max());
  pending_.assign(members_.size(), 0);
  deferred_.assign(members_.size(), false);
  for (size_t b = 0; b < members_.size(); ++b) {
    for (const size_t i : members_[b]) {
      LOOM_ASSERT(i < params_.size() && bucket_of_[i] == std::numeric_limits<size_t>::max(),
                  "every parameter is in exactly one bucket");
      bucket_of_[i] = b;
      if (group_sum_[i]) deferred_[b] = true;
    }
    pending_[b] = static_cast<int>(members_[b].size());
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    LOOM_ASSERT(bucket_of_[i] != std::numeric_limits<size_t>::max(),
                "every parameter is in a bucket");
  }
  std::fill(ready_.begin(), ready_.end(), false);
  next_launch_ = 0;
}

void GradBuckets::observe(size_t index) {
  if (observing_ && !observed_[index]) {
    observed_[index] = true;
    observed_order_.push_back(index);
  }
}

void GradBuckets::on_ready(size_t index, uint64_t micro_batch) {
  observe(index);
  if (!syncing_) return;  // no_sync: the gradient stays in its bucket and accumulates
  if (final_micro_batch_ != 0 && micro_batch != final_micro_batch_) return;
  nn::Parameter& p = *params_[index];
  const uint64_t other = p.incomplete_micro_batch(micro_batch);
  LOOM_CHECK(other == 0, owner_, ": parameter '", p.name(), "' is complete for micro-batch ",
             micro_batch, ", the step's last, while micro-batch ", other,
             " has written only some of its ", p.uses_per_backward(),
             " uses of it; run every earlier micro-batch's backward_weight before the last one's "
             "(NOTE [final micro-batch])");
  mark_ready(index);
}

void GradBuckets::mark_ready(size_t index) {
  LOOM_CHECK(!ready_[index], owner_, ": parameter '", params_[index]->name(),
             "' became ready twice in one synchronized backward; call finish() after each "
             "synchronized backward, name the step's last micro-batch when several are in "
             "flight, and build a parameter used k times per backward with uses_per_backward = k");
  if (first_ready_ns_ == 0) first_ready_ns_ = trace::now_ns();
  observe(index);
  ready_[index] = true;
  params_[index]->set_reduction_pending(owner_.c_str());  // NOTE [unfinished reduction]
  if (--pending_[bucket_of_[index]] == 0) launch_in_order();
}

void GradBuckets::launch_in_order() {
  // Strictly in index order: a bucket that fills early waits for its
  // predecessors, and a deferred one for finish() (NOTE [group sums]).
  while (next_launch_ < members_.size() && pending_[next_launch_] == 0 &&
         !deferred_[next_launch_]) {
    launch_(next_launch_++);
  }
}

void GradBuckets::launch_remaining() {
  for (size_t b = 0; b < members_.size(); ++b) {
    for (const size_t index : members_[b]) {  // launching never changes the buckets
      if (ready_[index]) continue;
      nn::Parameter& p = *params_[index];
      if (p.grad_written()) {
        mark_ready(index);  // written by micro-batches that were not final: complete
      } else if (unused_ == UnusedParameters::zero_fill) {
        // A real (zero) write, so grad() keeps the reduced value afterwards.
        nn::Parameter::GradWrite write = p.begin_grad_write();
        if (!write.accumulate) write.grad.zero();
        for (int use = 0; use < p.uses_per_backward() && !ready_[index]; ++use) {
          p.end_grad_write();
        }
        if (!ready_[index]) mark_ready(index);
      } else {
        // Still reduce (zeros), so every rank issues the same collectives;
        // end_step() then fails all ranks together.
        first_unused_ = std::min(first_unused_, static_cast<int64_t>(index));
        (void)p.grad();
        mark_ready(index);
      }
    }
  }
  if (std::find(deferred_.begin(), deferred_.end(), true) != deferred_.end()) {
    run_group_sums();
    std::fill(deferred_.begin(), deferred_.end(), false);
    launch_in_order();
  }
  LOOM_ASSERT(next_launch_ == members_.size(), "every bucket is launched by now");
}

void GradBuckets::run_group_sums() {
  std::vector<size_t> order;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (group_sum_[i]) order.push_back(i);
  }
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return params_[a]->name() < params_[b]->name(); });
  std::vector<comm::Work> works;
  for (const size_t i : order) {
    nn::Parameter& p = *params_[i];
    const nn::Placement& placement = p.placement();
    const bool over_tp = placement.sum_grad_over_tp && wider_than_one(groups_.tp);
    if (over_tp) works.push_back(groups_.tp->all_reduce(p.grad(), {.op = comm::ReduceOp::sum}));
    if (placement.tied_across_stages && wider_than_one(groups_.embedding)) {
      if (over_tp) works.back().wait();  // the embedding sum reads the tp sum
      works.push_back(groups_.embedding->all_reduce(p.grad(), {.op = comm::ReduceOp::sum}));
    }
  }
  for (comm::Work& work : works) {
    work.block_stream(current_stream(control_device_));
    work.wait();
  }
}

void GradBuckets::end_step() {
  for (size_t b = 0; b < members_.size(); ++b) {
    pending_[b] = static_cast<int>(members_[b].size());
    for (const size_t i : members_[b]) deferred_[b] = deferred_[b] || group_sum_[i];
  }
  std::fill(ready_.begin(), ready_.end(), false);
  for (nn::Parameter* p : params_) p->set_reduction_pending(nullptr);
  next_launch_ = 0;
  first_ready_ns_ = 0;
  final_micro_batch_ = 0;
  const int64_t first_unused = first_unused_;
  first_unused_ = kNone;
  if (unused_ != UnusedParameters::error) return;
  const int64_t size = dp_.size();
  const int64_t key = first_unused == kNone ? kNone : first_unused * size + dp_.rank();
  const int64_t agreed = all_reduce_min(dp_, key, control_device_);
  if (agreed == kNone) return;
  const auto index = static_cast<size_t>(agreed / size);
  const int rank = static_cast<int>(agreed % size);
  throw Error(str_cat(
      owner_, ": parameter '", params_[index]->name(), "' received no gradient on ",
      dp_.describe_rank(rank),
      " before finish() (it took no part in the loss); if some parameters are unused by design, "
      "set the unused-parameter policy to UnusedParameters::zero_fill in the options, or leave "
      "the parameter out of the list"));
}

void GradBuckets::clear_observed() {
  observed_order_.clear();
  observed_order_.shrink_to_fit();
  std::fill(observed_.begin(), observed_.end(), false);
}

}  // namespace loom::parallel::detail
