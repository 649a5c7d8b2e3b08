// Numeric comparisons for every test: NaN never passes.
//
// NOTE [NaN in comparisons]: `diff > tol` is false for a NaN diff, and
// `std::max(worst, diff)` keeps `worst` when diff is NaN, so a test written
// either way passes a result that is all NaN. Every numeric comparison in the
// tests goes through these helpers instead:
//   - close(got, want, atol, rtol) is `|got - want| <= atol + rtol * |want|`,
//     written so that a NaN on either side is false (equal infinities are close:
//     an overflow expected by the test is not an error);
//   - error_of(got, want) is |got - want| with NaN (or one-sided infinity)
//     mapped to +infinity, so a maximum over errors keeps it; WorstError
//     accumulates such a maximum and where it happened;
//   - out_of_tolerance(got, want, atol, rtol) says what differs between two
//     vectors (possibly of different element types, e.g. float results against
//     a double reference): empty when every element is close(), otherwise how
//     many are not, the first of them with both values, and the largest error;
//   - AllClose(want, atol, rtol) is a Catch2 matcher for vectors that names the
//     first element out of tolerance and how many are;
//   - ValueRange is a running minimum and maximum in which a NaN is not lost.
// Each helper has a negative control in tests/support/compare_test.cpp: a NaN
// and a value just outside the tolerance must fail it.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace loom::test {

// |got - want|, or +infinity when either is NaN or exactly one is infinite
// (or both are infinite with opposite signs).
inline double error_of(double got, double want) {
  if (std::isnan(got) || std::isnan(want)) return std::numeric_limits<double>::infinity();
  if (std::isinf(got) || std::isinf(want)) {
    return got == want ? 0.0 : std::numeric_limits<double>::infinity();
  }
  return std::abs(got - want);
}

// |got - want| <= atol + rtol * |want|; false when either side is NaN, even
// under an infinite tolerance (one computed from data that held a NaN or an
// infinity would otherwise admit the infinite error a NaN maps to).
inline bool close(double got, double want, double atol, double rtol = 0.0) {
  if (std::isnan(got) || std::isnan(want)) return false;
  const double bound = atol + rtol * (std::isinf(want) ? 0.0 : std::abs(want));
  return error_of(got, want) <= bound;
}

// The largest error seen and where (first index with that error). A NaN error
// counts as +infinity, so it is never lost in the maximum.
struct WorstError {
  double value = 0.0;
  int64_t index = -1;  // where `value` was seen (the caller's index; -1 if none given)
  int64_t count = 0;   // errors added
  bool saw_nan = false;

  // An error computed by the caller (e.g. a relative error); NaN counts as +infinity.
  void add_error(double error, int64_t at = -1) {
    if (std::isnan(error)) {
      saw_nan = true;
      error = std::numeric_limits<double>::infinity();
    }
    if (count++ == 0 || error > value) {
      value = error;
      index = at;
    }
  }
  // The error of one element: error_of(got, want).
  void add(double got, double want, int64_t at = -1) {
    add_error(std::isnan(got) || std::isnan(want) ? std::nan("") : error_of(got, want), at);
  }
  // True when every error added is within `tol` (vacuously true when none
  // was); never after a NaN, even under an infinite tolerance.
  bool within(double tol) const { return !saw_nan && value <= tol; }
};

// max_i |a[i] - b[i]|, +infinity for a NaN anywhere or different sizes.
template <typename T, typename U>
double max_abs_diff(std::span<const T> a, std::span<const U> b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  WorstError worst;
  for (size_t i = 0; i < a.size(); ++i) {
    worst.add(static_cast<double>(a[i]), static_cast<double>(b[i]), static_cast<int64_t>(i));
  }
  return worst.value;
}
template <typename T, typename U>
double max_abs_diff(const std::vector<T>& a, const std::vector<U>& b) {
  return max_abs_diff(std::span<const T>(a), std::span<const U>(b));
}

// Empty when got and want have the same size and every element is
// close(got[i], want[i], atol, rtol); otherwise a description of what is not,
// naming the first element out of tolerance. It names the values without
// printing whole vectors, so a per-tensor check reads
//   INFO("dx"); REQUIRE(out_of_tolerance(got, want, 1e-5) == "");
template <typename T, typename U>
std::string out_of_tolerance(std::span<const T> got, std::span<const U> want, double atol,
                             double rtol = 0.0) {
  std::ostringstream why;
  if (got.size() != want.size()) {
    why << "sizes differ: " << got.size() << " vs " << want.size();
    return why.str();
  }
  int64_t bad = 0, first = -1;
  WorstError worst;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    worst.add(g, w, static_cast<int64_t>(i));
    if (!close(g, w, atol, rtol)) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  if (bad == 0) return {};
  why.precision(9);
  why << bad << " of " << got.size() << " elements out of tolerance (atol " << atol << ", rtol "
      << rtol << "); first at [" << first
      << "]: " << static_cast<double>(got[static_cast<size_t>(first)]) << " vs "
      << static_cast<double>(want[static_cast<size_t>(first)]) << "; largest error " << worst.value
      << " at [" << worst.index << "]";
  return why.str();
}
template <typename T, typename U>
std::string out_of_tolerance(const std::vector<T>& got, const std::vector<U>& want, double atol,
                             double rtol = 0.0) {
  return out_of_tolerance(std::span<const T>(got), std::span<const U>(want), atol, rtol);
}

// The largest |got - want| / (atol + rtol * |want|) over lists of tensors (a
// model's parameters, say): <= 1 means every element is close(). +infinity for
// a NaN anywhere or a size mismatch, so `CHECK(tolerance_ratio(...) <= 1)`
// cannot pass on NaN; the ratio itself says how near the tolerance a run came.
inline double tolerance_ratio(const std::vector<std::vector<float>>& got,
                              const std::vector<std::vector<float>>& want, double atol,
                              double rtol) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  WorstError worst;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].size() != want[i].size()) return std::numeric_limits<double>::infinity();
    for (size_t k = 0; k < got[i].size(); ++k) {
      const double w = want[i][k];
      worst.add_error(error_of(got[i][k], w) / (atol + rtol * std::abs(w)));
    }
  }
  return worst.saw_nan ? std::numeric_limits<double>::infinity() : worst.value;
}

// The smallest and largest of the values added. A running std::min/std::max
// keeps its first argument when the other is NaN, so a NaN would vanish from
// it; here a NaN widens the range to [-infinity, +infinity], which fails every
// bound a test puts on the values (lo >= a, hi <= b, hi == c).
struct ValueRange {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  int64_t count = 0;  // values added

  void add(double v) {
    ++count;
    if (std::isnan(v)) {
      lo = -std::numeric_limits<double>::infinity();
      hi = std::numeric_limits<double>::infinity();
      return;
    }
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
};

// Catch2 matcher: every element of the vector is close() to `want`'s.
//   CHECK_THAT(got, AllClose(want, 1e-5));
template <typename T>
class AllCloseMatcher : public Catch::MatcherBase<std::vector<T>> {
 public:
  AllCloseMatcher(std::vector<T> want, double atol, double rtol)
      : want_(std::move(want)), atol_(atol), rtol_(rtol) {}

  bool match(const std::vector<T>& got) const override {
    detail_ = out_of_tolerance(got, want_, atol_, rtol_);
    return detail_.empty();
  }

  std::string describe() const override {
    std::ostringstream out;
    out << "is close to the expected " << want_.size() << " values";
    if (detail_.empty()) {
      out << " (atol " << atol_ << ", rtol " << rtol_ << ")";
    } else {
      out << ": " << detail_;  // names the tolerance too
    }
    return out.str();
  }

 private:
  std::vector<T> want_;
  double atol_, rtol_;
  mutable std::string detail_;  // Catch2 2.x calls describe() after match()
};

template <typename T>
AllCloseMatcher<T> AllClose(std::vector<T> want, double atol, double rtol = 0.0) {
  return AllCloseMatcher<T>(std::move(want), atol, rtol);
}

// Catch2 matcher for one value: CHECK_THAT(loss, Near(2.5, 1e-6)).
class NearMatcher : public Catch::MatcherBase<double> {
 public:
  NearMatcher(double want, double atol, double rtol) : want_(want), atol_(atol), rtol_(rtol) {}
  bool match(const double& got) const override { return close(got, want_, atol_, rtol_); }
  std::string describe() const override {
    std::ostringstream out;
    out.precision(9);
    out << "is within " << atol_ << " + " << rtol_ << " x |want| of " << want_;
    return out.str();
  }

 private:
  double want_, atol_, rtol_;
};

inline NearMatcher Near(double want, double atol, double rtol = 0.0) {
  return NearMatcher(want, atol, rtol);
}

}  // namespace loom::test
