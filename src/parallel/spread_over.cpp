#include "loom/parallel/spread_over.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "loom/core/error.hpp"
#include "parallel/control.hpp"

namespace loom::parallel {

double Spread::excess() const {
  return median > 0 ? max / median - 1.0 : 0.0;
}

std::string Spread::summary(std::string_view what, double scale, std::string_view unit,
                            double threshold) const {
  char text[256];
  std::snprintf(text, sizeof(text), "%.*s %.1f-%.1f %.*s (median %.1f) over %d rank%s",
                static_cast<int>(what.size()), what.data(), min * scale, max * scale,
                static_cast<int>(unit.size()), unit.data(), median * scale, ranks,
                ranks == 1 ? "" : "s");
  std::string out = text;
  if (notable(threshold)) {
    std::snprintf(text, sizeof(text), "; rank %d %.0f%% above the median", max_rank,
                  100.0 * excess());
    out += text;
  }
  return out;
}

Spread spread_over(comm::Communicator& group, double value, Device device) {
  LOOM_CHECK(std::isfinite(value), "spread_over: the value of rank ", group.rank(), " of group '",
             group.name(), "' is ", value, "; it must be finite");
  const std::vector<double> values = detail::all_gather_values(group, value, device);
  Spread s;
  s.ranks = static_cast<int>(values.size());
  s.min_rank = static_cast<int>(std::min_element(values.begin(), values.end()) - values.begin());
  s.max_rank = static_cast<int>(std::max_element(values.begin(), values.end()) - values.begin());
  s.min = values[static_cast<size_t>(s.min_rank)];
  s.max = values[static_cast<size_t>(s.max_rank)];
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  s.median = n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  return s;
}

}  // namespace loom::parallel
