// Element-wise ops: argument checks, then dispatch by device.
#include "loom/kernels/elementwise.hpp"

#include <initializer_list>
#include <string>

#include "kernels/cpu/elementwise.hpp"
#include "kernels/elementwise_args.hpp"
#include "kernels/tensor_checks.hpp"
#include "loom/config.hpp"
#include "loom/core/stream.hpp"

#if LOOM_HAS_CUDA
#include "kernels/cuda/elementwise.cuh"
#endif

namespace loom::kernels {
namespace {

struct Operand {
  const char* name;
  const Tensor& tensor;
};

// `inputs` and `out` must agree in element count, dtype and device; out may be
// an input exactly (in place) but may not partly overlap one.
void check_operands(const char* op, std::initializer_list<Operand> inputs, const Operand& out) {
  std::string all;
  for (const Operand& t : inputs) all += str_cat(t.name, " ", t.tensor, ", ");
  all += str_cat(out.name, " ", out.tensor);
  for (const Operand& t : inputs) {
    LOOM_CHECK(t.tensor.defined(), op, ": ", t.name, " is undefined (", all, ")");
  }
  LOOM_CHECK(out.tensor.defined(), op, ": ", out.name, " is undefined (", all, ")");
  const Tensor& o = out.tensor;
  LOOM_CHECK(is_floating(o.dtype()), op, ": dtype ", o.dtype(),
             " is not a floating-point type (f32, bf16, f16) (", all, ")");
  for (const Operand& t : inputs) {
    LOOM_CHECK(t.tensor.numel() == o.numel(), op, ": ", t.name, " has ", t.tensor.numel(),
               " elements but ", out.name, " has ", o.numel(),
               "; element-wise operands need the same element count (", all, ")");
    LOOM_CHECK(t.tensor.dtype() == o.dtype(), op, ": element-wise operands need one dtype; got ",
               all);
    LOOM_CHECK(t.tensor.device() == o.device(), op, ": element-wise operands need one device; got ",
               all);
    LOOM_CHECK(detail::same_elements(t.tensor, o) || !detail::overlaps(t.tensor, o), op, ": ",
               out.name, " partly overlaps ", t.name,
               "; an output may be an input exactly (in place) but not overlap one partly (", all,
               ")");
  }
}

void run(const detail::ElementwiseArgs& args, Device device) {
  if (args.n == 0) return;
  if (device.is_cpu()) {
    cpu::elementwise(args);
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(device);
  cuda::elementwise(args, current_stream(device).native_handle());
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

void binary_op(const char* name, ElementwiseOp op, const Tensor& a, const Tensor& b,
               const Tensor& out) {
  check_operands(name, {{"a", a}, {"b", b}}, {"out", out});
  detail::ElementwiseArgs args;
  args.op = op;
  args.dtype = out.dtype();
  args.n = out.numel();
  args.x = a.data();
  args.y = b.data();
  args.out = out.data();
  run(args, out.device());
}

}  // namespace

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  binary_op("add", ElementwiseOp::add, a, b, out);
}

void sub(const Tensor& a, const Tensor& b, const Tensor& out) {
  binary_op("sub", ElementwiseOp::sub, a, b, out);
}

void mul(const Tensor& a, const Tensor& b, const Tensor& out) {
  binary_op("mul", ElementwiseOp::mul, a, b, out);
}

void scale(const Tensor& x, float alpha, const Tensor& out) {
  check_operands("scale", {{"x", x}}, {"out", out});
  detail::ElementwiseArgs args;
  args.op = ElementwiseOp::scale;
  args.dtype = out.dtype();
  args.n = out.numel();
  args.x = x.data();
  args.out = out.data();
  args.alpha = alpha;
  run(args, out.device());
}

void axpy(float alpha, const Tensor& x, const Tensor& y) {
  check_operands("axpy", {{"x", x}}, {"y", y});
  detail::ElementwiseArgs args;
  args.op = ElementwiseOp::axpy;
  args.dtype = y.dtype();
  args.n = y.numel();
  args.x = x.data();
  args.y = y.data();
  args.out = y.data();
  args.alpha = alpha;
  run(args, y.device());
}

void axpby(float alpha, const Tensor& x, float beta, const Tensor& y) {
  check_operands("axpby", {{"x", x}}, {"y", y});
  detail::ElementwiseArgs args;
  // beta == 0 must not read y (it may hold NaN): that is a scale of x.
  args.op = beta == 0.0f ? ElementwiseOp::scale : ElementwiseOp::axpby;
  args.dtype = y.dtype();
  args.n = y.numel();
  args.x = x.data();
  args.y = beta == 0.0f ? nullptr : y.data();
  args.out = y.data();
  args.alpha = alpha;
  args.beta = beta;
  run(args, y.device());
}

OpCost elementwise_cost(ElementwiseOp op, const Tensor& out) {
  LOOM_CHECK(out.defined(), "elementwise_cost: the output tensor is undefined");
  const auto n = static_cast<double>(out.numel());
  const auto size = static_cast<double>(out.element_size());
  double flops_per_element = 1, tensors = 3;  // add, sub, mul: read a and b, write out
  switch (op) {
    case ElementwiseOp::add:
    case ElementwiseOp::sub:
    case ElementwiseOp::mul:
      break;
    case ElementwiseOp::scale:
      tensors = 2;
      break;
    case ElementwiseOp::axpy:
      flops_per_element = 2;
      break;
    case ElementwiseOp::axpby:
      flops_per_element = 3;
      break;
  }
  return OpCost{flops_per_element * n, tensors * n * size};
}

}  // namespace loom::kernels
