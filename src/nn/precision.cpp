#include "loom/nn/precision.hpp"

#include "loom/core/error.hpp"

namespace loom::nn {

Precision precision_from_string(const std::string& name) {
  if (name == "fp32") return {.matmul = DType::f32};
  if (name == "bf16") return {.matmul = DType::bf16, .activations = DType::bf16};
  if (name == "fp16") return {.matmul = DType::f16};
  throw Error(str_cat("precision '", name, "' is not one of fp32, bf16, fp16"));
}

std::string precision_name(const Precision& precision) {
  switch (precision.matmul) {
    case DType::f32:
      return "fp32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "fp16";
    default:
      throw Error(str_cat("precision: matrix products in ", precision.matmul,
                          " are not supported (f32, bf16 or f16)"));
  }
}

}  // namespace loom::nn
