#include "loom/trace/op_scope.hpp"

#include "loom/trace/profiler.hpp"
#include "trace/profiling_flag.hpp"

namespace loom::trace {
namespace {

thread_local kernels::OpCost counted;

}  // namespace

kernels::OpCost thread_counted_cost() {
  return counted;
}

OpScope::OpScope(const char* op, const kernels::OpCost& cost, Device device,
                 std::string_view detail) {
  counted += cost;
  if (detail::profiling_on()) {
    record_ = Profiler::instance().open_op(op, cost.flops, cost.bytes, device, detail);
  }
}

OpScope::~OpScope() {
  if (record_ >= 0) Profiler::instance().close_op(record_);
}

}  // namespace loom::trace
