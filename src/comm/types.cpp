#include "loom/comm/types.hpp"

#include <cstdio>

namespace loom::comm {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "?";
}

std::string_view op_type_name(OpType op) {
  switch (op) {
    case OpType::all_reduce:
      return "all_reduce";
    case OpType::reduce_scatter:
      return "reduce_scatter";
    case OpType::all_gather:
      return "all_gather";
    case OpType::broadcast:
      return "broadcast";
    case OpType::reduce:
      return "reduce";
    case OpType::all_to_all:
      return "all_to_all";
    case OpType::send:
      return "send";
    case OpType::recv:
      return "recv";
    case OpType::barrier:
      return "barrier";
  }
  return "?";
}

namespace {
std::string human_bytes(size_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.1f %s", value, kUnits[unit]);
  return text;
}
}  // namespace

std::string OpInfo::describe() const {
  std::string text = str_cat(op_type_name(op), " #", seq);
  if (op == OpType::send) text += str_cat(" to rank ", peer);
  if (op == OpType::recv) text += str_cat(" from rank ", peer);
  text += str_cat(" on group '", group, "'");
  if (op != OpType::barrier) {
    text += str_cat(" (", count, " ", dtype, " elements, ", human_bytes(bytes));
    if (op == OpType::broadcast || op == OpType::reduce) text += str_cat(", root ", peer);
    text += ")";
  }
  return text;
}

}  // namespace loom::comm
