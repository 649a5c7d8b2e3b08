#include "loom/parallel/uneven_inputs.hpp"

#include <vector>

#include "loom/core/error.hpp"
#include "loom/core/logging.hpp"
#include "parallel/control.hpp"

namespace loom::parallel {

UnevenInputs::UnevenInputs(comm::Communicator& dp, Device device)
    : dp_(dp), device_(device), logged_out_(static_cast<size_t>(dp.size()), false) {}

void UnevenInputs::check_open(const char* what) const {
  LOOM_CHECK(step_ >= 0, "UnevenInputs::", what, " on rank ", dp_.rank(), " of group '", dp_.name(),
             "': call next() first (it opens each step)");
  LOOM_CHECK(!ended_, "UnevenInputs::", what, " on rank ", dp_.rank(), " of group '", dp_.name(),
             "': the loop ended at step ", step_, " (next() returned false: no rank had a batch)");
}

bool UnevenInputs::next(bool has_batch) {
  LOOM_CHECK(!ended_, "UnevenInputs::next on rank ", dp_.rank(), " of group '", dp_.name(),
             "': the loop already ended at step ", step_,
             " (next() returned false: no rank had a batch)");
  ++step_;
  with_batch_.clear();
  const std::vector<double> flags = detail::all_gather_values(dp_, has_batch ? 1.0 : 0.0, device_);
  for (int r = 0; r < dp_.size(); ++r) {
    if (flags[static_cast<size_t>(r)] != 0.0) with_batch_.push_back(r);
  }
  has_batch_ = has_batch;
  active_ = static_cast<int>(with_batch_.size());
  if (active_ == 0) {
    ended_ = true;
    return false;
  }
  if (active_ < dp_.size()) {
    size_t next_with = 0;
    for (int r = 0; r < dp_.size(); ++r) {
      if (next_with < with_batch_.size() && with_batch_[next_with] == r) {
        ++next_with;
        continue;
      }
      if (logged_out_[static_cast<size_t>(r)]) continue;
      logged_out_[static_cast<size_t>(r)] = true;
      if (dp_.rank() == 0) {
        LOOM_LOG_INFO("uneven inputs on group '", dp_.name(), "': rank ", r,
                      " has no batch at step ", step_,
                      " (logged once per rank); it runs stand-in steps with loss weight 0 while "
                      "it has none, and ",
                      active_, " of ", dp_.size(), " ranks share this step's update");
      }
    }
  }
  return true;
}

double UnevenInputs::loss_weight() const {
  check_open("loss_weight");
  if (!has_batch_) return 0.0;
  return static_cast<double>(dp_.size()) / static_cast<double>(active_);
}

double UnevenInputs::mean(double value) {
  check_open("mean");
  if (dp_.size() == 1) return value;
  const std::vector<double> values =
      detail::all_gather_values(dp_, has_batch_ ? value : 0.0, device_);
  double sum = 0;  // in rank order: the same bits on every rank
  for (const int r : with_batch_) sum += values[static_cast<size_t>(r)];
  return sum / active_;
}

}  // namespace loom::parallel
