// Range checks for the numeric flags of Loom's example programs and
// benchmarks, as CLI11 validators whose messages name the flag, the value and
// the rule ("--layers: 0 must be at least 1"), so that a bad value is refused
// before any rank starts communicating. (CLI11 2.1's own PositiveNumber says
// "Value 0 not in range 0.000000 to 17976931348623157...".)
//
//   app.add_option("--layers", f.layers)->check(flags::at_least(1));
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>

namespace flags {

namespace detail {
inline std::string number(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}
// The value as a number, or NaN when it is not one (CLI11's conversion then
// reports it).
inline double parse(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  return end != text.c_str() && *end == '\0' ? v : std::nan("");
}
}  // namespace detail

// value >= lo
inline CLI::Validator at_least(double lo) {
  return CLI::Validator(
      [lo](std::string& text) -> std::string {
        const double v = detail::parse(text);
        if (std::isnan(v) || v >= lo) return "";
        return text + " must be at least " + detail::number(lo);
      },
      ">=" + detail::number(lo));
}

// value > 0
inline CLI::Validator positive() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const double v = detail::parse(text);
        if (std::isnan(v) || v > 0) return "";
        return text + " must be greater than 0";
      },
      ">0");
}

// lo <= value <= hi
inline CLI::Validator between(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        const double v = detail::parse(text);
        if (std::isnan(v) || (v >= lo && v <= hi)) return "";
        return text + " must be from " + detail::number(lo) + " to " + detail::number(hi);
      },
      "[" + detail::number(lo) + ", " + detail::number(hi) + "]");
}

}  // namespace flags
