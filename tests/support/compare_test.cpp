// Negative controls for the comparison helpers (NOTE [NaN in comparisons]):
// each helper must fail on a NaN and on a value just outside its tolerance,
// and pass on a value just inside it.
#include "compare.hpp"

#include <limits>
#include <vector>

using loom::test::AllClose;
using loom::test::close;
using loom::test::error_of;
using loom::test::max_abs_diff;
using loom::test::Near;
using loom::test::out_of_tolerance;
using loom::test::ValueRange;
using loom::test::WorstError;

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

TEST_CASE("compare: close() fails NaN and values off by more than the tolerance", "[support]") {
  CHECK(close(1.0, 1.0, 0.0));
  CHECK(close(1.0 + 0.9e-3, 1.0, 1e-3));
  CHECK_FALSE(close(1.0 + 1.1e-3, 1.0, 1e-3));
  CHECK_FALSE(close(1.0 - 1.1e-3, 1.0, 1e-3));
  CHECK(close(101.0, 100.0, 0.0, 0.011));
  CHECK_FALSE(close(101.2, 100.0, 0.0, 0.011));
  CHECK_FALSE(close(kNaN, 1.0, 1e9));
  CHECK_FALSE(close(1.0, kNaN, 1e9));
  CHECK_FALSE(close(kNaN, kNaN, 1e9));
  CHECK_FALSE(close(kInf, 1.0, 1e9));
  CHECK_FALSE(close(kInf, -kInf, 1e9));
  CHECK(close(kInf, kInf, 0.0));
  // A tolerance computed from data that held a NaN or an infinity does not let a NaN through.
  CHECK_FALSE(close(kNaN, 1.0, kInf));
  CHECK_FALSE(close(1.0, kNaN, 0.0, kInf));
}

TEST_CASE("compare: error_of and WorstError keep a NaN as the largest error", "[support]") {
  CHECK(error_of(2.0, 1.5) == 0.5);
  CHECK(error_of(kNaN, 1.0) == kInf);
  CHECK(error_of(1.0, -kInf) == kInf);

  WorstError worst;
  CHECK(worst.within(0.0));
  worst.add(1.0, 1.25, 0);
  worst.add(kNaN, 1.0, 1);  // a NaN after a finite error is not lost...
  worst.add(3.0, 3.5, 2);   // ...nor replaced by a later finite one
  CHECK(worst.value == kInf);
  CHECK(worst.index == 1);
  CHECK_FALSE(worst.within(1e30));

  WorstError off;
  off.add(1.0, 1.0 + 2e-6, 0);
  off.add(5.0, 5.0, 1);
  CHECK(off.within(2.5e-6));
  CHECK_FALSE(off.within(1.5e-6));
  CHECK(off.index == 0);

  WorstError relative;
  relative.add_error(kNaN, 7);
  CHECK_FALSE(relative.within(1.0));
  CHECK_FALSE(relative.within(kInf));
  CHECK(relative.index == 7);
}

TEST_CASE("compare: max_abs_diff is infinite for a NaN or a size mismatch", "[support]") {
  const std::vector<float> a{1.0f, 2.0f, 3.0f};
  CHECK(max_abs_diff(a, std::vector<float>{1.0f, 2.5f, 3.0f}) == 0.5);
  CHECK(max_abs_diff(a, std::vector<double>{1.0, 2.0, kNaN}) == kInf);
  CHECK(max_abs_diff(std::vector<double>{kNaN, 2.0, 3.0}, a) == kInf);
  CHECK(max_abs_diff(a, std::vector<float>{1.0f, 2.0f}) == kInf);
}

TEST_CASE("compare: the AllClose and Near matchers fail NaN and off-by-tolerance values",
          "[support]") {
  const std::vector<float> want{1.0f, -2.0f, 0.5f};
  CHECK_THAT(want, AllClose(want, 0.0));
  CHECK_THAT((std::vector<float>{1.0f, -2.0f, 0.5009f}), AllClose(want, 1e-3));
  CHECK_FALSE(AllClose(want, 1e-3).match(std::vector<float>{1.0f, -2.0f, 0.5011f}));
  CHECK_FALSE(AllClose(want, 1e9).match(std::vector<float>{1.0f, std::nanf(""), 0.5f}));
  CHECK_FALSE(AllClose(want, 1e9).match(std::vector<float>{1.0f, -2.0f}));

  // The description names the first bad element.
  const auto matcher = AllClose(want, 1e-3);
  REQUIRE_FALSE(matcher.match(std::vector<float>{1.0f, -2.5f, 0.5f}));
  CHECK_THAT(matcher.describe(), Catch::Contains("1 of 3 elements") && Catch::Contains("[1]"));

  CHECK_THAT(2.0, Near(2.0, 0.0));
  CHECK_THAT(2.0009, Near(2.0, 1e-3));
  CHECK_FALSE(Near(2.0, 1e-3).match(2.0011));
  CHECK_FALSE(Near(2.0, 1e9).match(kNaN));
}

TEST_CASE(
    "compare: out_of_tolerance() describes NaN and off-by-tolerance elements, across element types",
    "[support]") {
  const std::vector<float> got{1.0f, -2.0f, 0.5f};
  const std::vector<double> want{1.0, -2.0, 0.5};
  CHECK(out_of_tolerance(got, want, 0.0) == "");
  CHECK(out_of_tolerance(std::vector<float>{1.0f, -2.0f, 0.5009f}, want, 1e-3) == "");
  CHECK(out_of_tolerance(std::vector<double>{1.0, -2.0, 0.5 + 0.99e-2}, want, 0.0, 2e-2) == "");
  CHECK(out_of_tolerance(std::vector<float>{1.0f, -2.0f, 0.5011f}, want, 1e-3) != "");
  CHECK(out_of_tolerance(std::vector<double>{1.0, -2.0, 0.5 + 1.01e-2}, want, 0.0, 2e-2) != "");
  CHECK(out_of_tolerance(std::vector<float>{1.0f, std::nanf(""), 0.5f}, want, 1e9) != "");
  CHECK(out_of_tolerance(got, std::vector<double>{kNaN, -2.0, 0.5}, 1e9) != "");
  CHECK(out_of_tolerance(got, std::vector<double>{1.0, -2.0}, 1e9) != "");
  CHECK(out_of_tolerance(std::vector<float>{}, std::vector<double>{}, 0.0) == "");
  // It names the first element out of tolerance with both values, and the worst one.
  CHECK_THAT(out_of_tolerance(std::vector<float>{1.0f, std::nanf(""), 0.75f}, want, 1e-3),
             Catch::Contains("2 of 3 elements") && Catch::Contains("first at [1]: nan vs -2") &&
                 Catch::Contains("largest error inf at [1]"));
}

TEST_CASE("compare: ValueRange keeps a NaN, which fails any bound on the range", "[support]") {
  ValueRange empty;
  CHECK(empty.count == 0);
  CHECK(empty.lo == kInf);
  CHECK(empty.hi == -kInf);

  ValueRange in;
  for (const double v : {0.5, -2.0, 2.999}) in.add(v);
  CHECK(in.lo == -2.0);
  CHECK(in.hi == 2.999);
  CHECK(in.count == 3);
  CHECK(in.lo >= -2.0);
  CHECK(in.hi < 3.0);

  ValueRange out;
  for (const double v : {0.5, -2.0, 3.0001}) out.add(v);
  CHECK_FALSE(out.hi < 3.0);

  ValueRange nan;
  nan.add(0.5);
  nan.add(kNaN);  // not lost...
  nan.add(1.0);   // ...nor forgotten by a later value
  CHECK_FALSE(nan.lo >= -2.0);
  CHECK_FALSE(nan.hi < 3.0);
  CHECK_FALSE(nan.hi <= 1e300);
  CHECK_FALSE(nan.hi == 1.0);
  CHECK(nan.count == 3);
}

TEST_CASE("compare: tolerance_ratio is infinite for a NaN and above 1 off tolerance", "[support]") {
  using loom::test::tolerance_ratio;
  const std::vector<std::vector<float>> want{{1.0f, 2.0f}, {4.0f}};
  CHECK(tolerance_ratio(want, want, 1e-6, 0.0) == 0.0);
  CHECK(tolerance_ratio({{1.0f, 2.0f}, {4.0003f}}, want, 0.0, 1e-4) <= 1.0);
  CHECK(tolerance_ratio({{1.0f, 2.0f}, {4.0005f}}, want, 0.0, 1e-4) > 1.0);
  CHECK(tolerance_ratio({{1.0f, std::nanf("")}, {4.0f}}, want, 1e9, 0.0) == kInf);
  CHECK(tolerance_ratio({{1.0f, 2.0f}}, want, 1e9, 0.0) == kInf);
  CHECK(tolerance_ratio({{1.0f}, {4.0f}}, want, 1e9, 0.0) == kInf);
}
