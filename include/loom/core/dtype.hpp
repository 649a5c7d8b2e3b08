// Element types of tensors.
//
// f32, bf16 and f16 are floating point; i32 and i64 are integers. The C++
// type of each is float, loom::bfloat16, loom::float16, int32_t, int64_t;
// dtype_of<T>() maps back. visit_dtype(dtype, f) calls f with a value of the
// matching C++ type (a tag) so that code can be written once per type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>
#include <type_traits>

#include "loom/core/half.hpp"

namespace loom {

enum class DType : uint8_t { f32 = 0, bf16 = 1, f16 = 2, i32 = 3, i64 = 4 };

inline constexpr DType kAllDTypes[] = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64};

constexpr size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
  }
  return 0;
}

constexpr bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
}

constexpr std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
  }
  return "?";
}

// Parses "f32", "bf16", "f16", "i32", "i64" (also "float32", "bfloat16",
// "float16", "int32", "int64"); throws loom::Error naming the text otherwise.
DType parse_dtype(std::string_view text);

inline std::ostream& operator<<(std::ostream& out, DType dtype) {
  return out << dtype_name(dtype);
}

template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::f32;
  else if constexpr (std::is_same_v<T, bfloat16>)
    return DType::bf16;
  else if constexpr (std::is_same_v<T, float16>)
    return DType::f16;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DType::i32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::i64;
  else
    static_assert(sizeof(T) == 0, "type has no loom::DType");
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with T the C++ type of `dtype`.
template <typename F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32:
      return f(TypeTag<float>{});
    case DType::bf16:
      return f(TypeTag<bfloat16>{});
    case DType::f16:
      return f(TypeTag<float16>{});
    case DType::i32:
      return f(TypeTag<int32_t>{});
    case DType::i64:
      return f(TypeTag<int64_t>{});
  }
  return f(TypeTag<float>{});  // unreachable for valid enum values
}

}  // namespace loom
