#include "loom/parallel/pipeline/partition.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "loom/core/error.hpp"

namespace loom::parallel::pipeline {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

void check_problem(const PartitionProblem& p) {
  const size_t chunks = p.chunk_costs.size();
  LOOM_CHECK(chunks >= 1, "partition: no chunks to cut the layers into");
  LOOM_CHECK(p.min_layers.size() == chunks, "partition: ", p.min_layers.size(),
             " minimum layer counts for ", chunks, " chunks; one per chunk");
  LOOM_CHECK(p.chunk_ranks.empty() || p.chunk_ranks.size() == chunks,
             "partition: ", p.chunk_ranks.size(), " chunk ranks for ", chunks,
             " chunks; one per chunk, or none");
  for (size_t c = 0; c < p.chunk_ranks.size(); ++c) {
    LOOM_CHECK(p.chunk_ranks[c] >= 0, "partition: chunk ", c, " is on rank ", p.chunk_ranks[c],
               "; a rank must be >= 0");
  }
  int64_t demanded = 0;
  for (size_t c = 0; c < chunks; ++c) {
    LOOM_CHECK(std::isfinite(p.chunk_costs[c]) && p.chunk_costs[c] >= 0, "partition: chunk ", c,
               " costs ", p.chunk_costs[c], "; a cost must be finite and >= 0");
    LOOM_CHECK(p.min_layers[c] >= 0, "partition: chunk ", c, " must take at least ",
               p.min_layers[c], " layers; a minimum must be >= 0");
    demanded += p.min_layers[c];
  }
  for (size_t i = 0; i < p.layer_costs.size(); ++i) {
    LOOM_CHECK(std::isfinite(p.layer_costs[i]) && p.layer_costs[i] >= 0, "partition: layer ", i,
               " costs ", p.layer_costs[i], "; a cost must be finite and >= 0");
  }
  LOOM_CHECK(demanded <= static_cast<int64_t>(p.layer_costs.size()), "partition: the ", chunks,
             " chunks must take at least ", demanded, " layers together, but there are only ",
             p.layer_costs.size());
}

}  // namespace

std::vector<double> partition_costs(const PartitionProblem& problem,
                                    const std::vector<int64_t>& cut) {
  check_problem(problem);
  LOOM_CHECK(cut.size() == problem.chunk_costs.size(), "partition: a cut of ", cut.size(),
             " chunks for a problem of ", problem.chunk_costs.size());
  std::vector<double> out(cut.size());
  size_t layer = 0;
  for (size_t c = 0; c < cut.size(); ++c) {
    LOOM_CHECK(cut[c] >= problem.min_layers[c], "partition: chunk ", c, " takes ", cut[c],
               " layers, fewer than its minimum ", problem.min_layers[c]);
    LOOM_CHECK(layer + static_cast<size_t>(cut[c]) <= problem.layer_costs.size(),
               "partition: the cut takes more than the ", problem.layer_costs.size(), " layers");
    double cost = problem.chunk_costs[c];
    for (int64_t i = 0; i < cut[c]; ++i) cost += problem.layer_costs[layer++];
    out[c] = cost;
  }
  LOOM_CHECK(layer == problem.layer_costs.size(), "partition: the cut takes ", layer, " of the ",
             problem.layer_costs.size(), " layers");
  return out;
}

std::vector<int64_t> balanced_partition(const PartitionProblem& problem) {
  check_problem(problem);
  const size_t n = problem.layer_costs.size();
  const size_t k = problem.chunk_costs.size();
  std::vector<double> prefix(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + problem.layer_costs[i];
  // Chunk c taking layers [i, j).
  auto cost = [&](size_t c, size_t i, size_t j) {
    return problem.chunk_costs[c] + (prefix[j] - prefix[i]);
  };
  auto min_of = [&](size_t c) { return static_cast<size_t>(problem.min_layers[c]); };

  // 1. worst[c][j]: the least possible largest cost of chunks 0..c-1 over layers [0, j).
  std::vector<std::vector<double>> worst(k + 1, std::vector<double>(n + 1, kInfinity));
  worst[0][0] = 0.0;
  for (size_t c = 1; c <= k; ++c) {
    for (size_t j = 0; j <= n; ++j) {
      for (size_t i = 0; i + min_of(c - 1) <= j; ++i) {
        if (worst[c - 1][i] == kInfinity) continue;
        worst[c][j] = std::min(worst[c][j], std::max(worst[c - 1][i], cost(c - 1, i, j)));
      }
    }
  }
  LOOM_CHECK(worst[k][n] < kInfinity, "partition: no cut of ", n, " layers into ", k,
             " chunks meets the minimum layer counts");
  const double limit = worst[k][n] * (1.0 + kPartitionTolerance);

  // 3 (before 2). squares[c][i]: the least sum of squared costs of chunks
  // c..k-1 over layers [i, n), each chunk within the limit.
  std::vector<std::vector<double>> squares(k + 1, std::vector<double>(n + 1, kInfinity));
  squares[k][n] = 0.0;
  for (size_t c = k; c-- > 0;) {
    for (size_t i = 0; i <= n; ++i) {
      for (size_t j = i + min_of(c); j <= n; ++j) {
        const double x = cost(c, i, j);
        if (x > limit || squares[c + 1][j] == kInfinity) continue;
        squares[c][i] = std::min(squares[c][i], x * x + squares[c + 1][j]);
      }
    }
  }

  // Sums of squares round: compared with a relative tolerance.
  auto below = [](double a, double b) { return a < b * (1.0 - 1e-12); };

  // 4 (after 3). From the first chunk on, the most layers that keep both optima.
  std::vector<int64_t> cut(k, 0);
  size_t i = 0;
  for (size_t c = 0; c < k; ++c) {
    const double target = squares[c][i];
    size_t chosen = n + 1;
    for (size_t j = n + 1; j-- > i + min_of(c);) {
      const double x = cost(c, i, j);
      if (x > limit || squares[c + 1][j] == kInfinity) continue;
      if (!below(target, x * x + squares[c + 1][j])) {
        chosen = j;
        break;
      }
    }
    LOOM_CHECK(chosen <= n, "partition: internal error: no chunk ", c,
               " continues the optimal cut");
    cut[c] = static_cast<int64_t>(chosen - i);
    i = chosen;
  }

  // 2. Where a rank holds several chunks: every cut that step 1 leaves, the
  // later layer counts first, so that among ties the first one found is step
  // 4's. A cut replaces the best only when strictly better.
  const std::vector<int>& ranks = problem.chunk_ranks;
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end()) return cut;
  const auto rank_count = static_cast<size_t>(sorted.back()) + 1;
  std::vector<int64_t> trial(k, 0), best = cut;
  std::vector<double> chunk_cost(k, 0.0);
  double best_load = kInfinity, best_squares = kInfinity;
  int64_t visited = 0;
  bool complete = true;
  auto walk = [&](auto&& self, size_t c, size_t from) -> void {
    if (!complete) return;
    if (c == k) {
      if (++visited > kPartitionSearchLimit) {
        complete = false;
        return;
      }
      std::vector<double> load(rank_count, 0.0);
      double sum_squares = 0;
      for (size_t d = 0; d < k; ++d) {
        load[static_cast<size_t>(ranks[d])] += chunk_cost[d];
        sum_squares += chunk_cost[d] * chunk_cost[d];
      }
      const double worst_load = *std::max_element(load.begin(), load.end());
      if (worst_load < best_load || (worst_load == best_load && below(sum_squares, best_squares))) {
        best_load = worst_load;
        best_squares = sum_squares;
        best = trial;
      }
      return;
    }
    for (size_t j = n + 1; j-- > from + min_of(c);) {
      const double x = cost(c, from, j);
      if (x > limit || squares[c + 1][j] == kInfinity) continue;
      trial[c] = static_cast<int64_t>(j - from);
      chunk_cost[c] = x;
      self(self, c + 1, j);
    }
  };
  walk(walk, 0, 0);
  return complete ? best : cut;
}

}  // namespace loom::parallel::pipeline
