#include "loom/core/dtype.hpp"

#include <string>

#include "loom/core/error.hpp"

namespace loom {

DType parse_dtype(std::string_view text) {
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"f32", DType::f32},     {"float32", DType::f32},   {"fp32", DType::f32},
      {"bf16", DType::bf16},   {"bfloat16", DType::bf16}, {"f16", DType::f16},
      {"float16", DType::f16}, {"fp16", DType::f16},      {"half", DType::f16},
      {"i32", DType::i32},     {"int32", DType::i32},     {"i64", DType::i64},
      {"int64", DType::i64},
  };
  for (const Alias& alias : kAliases) {
    if (alias.name == text) return alias.dtype;
  }
  throw Error(str_cat("dtype '", text, "' is not one of f32, bf16, f16, i32, i64"));
}

}  // namespace loom
