#include "loom/parallel/planner.hpp"

#include <algorithm>
#include <tuple>
#include <vector>

#include "loom/core/error.hpp"

// The search over layouts (plan) and the choice among them (recommended);
// estimate() in planner.cpp prices each one.
namespace loom::parallel::planner {
namespace {

// Recompute as the simplicity order counts it: none, the attention, whole blocks.
int recompute_level(const Layout& l) {
  return l.activation_checkpointing ? 2 : (l.checkpoint_attention ? 1 : 0);
}

}  // namespace

std::vector<Estimate> plan(const Workload& work, const Cluster& cluster,
                           const PlanOptions& options) {
  cluster.validate();
  work.model.validate();
  LOOM_CHECK(options.max_micro_batches >= 1, "planner: max micro-batches ",
             options.max_micro_batches, " must be at least 1");
  const int world = cluster.world();
  std::vector<Estimate> out;
  for (int tp = 1; tp <= world; ++tp) {
    if (world % tp != 0) continue;
    for (int pp = 1; pp <= world / tp; ++pp) {
      if ((world / tp) % pp != 0) continue;
      const int dp = world / tp / pp;
      const int64_t rows = work.batch % dp == 0 ? work.batch / dp : 0;
      for (const bool sp : {false, true}) {
        if (sp && tp == 1) continue;
        for (int stage = 0; stage <= (dp > 1 ? 3 : 0); ++stage) {
          for (const int recompute : {0, 1, 2}) {  // none, the attention, whole blocks
            if (recompute > 0 && !options.recompute) continue;
            // The fused attention keeps no probabilities to recompute.
            if (recompute == 1 && work.model.attention == nn::AttentionKernel::fused) continue;
            Layout base{.dp = dp,
                        .tp = tp,
                        .pp = pp,
                        .sequence_parallel = sp,
                        .zero_stage = stage,
                        .activation_checkpointing = recompute == 2,
                        .checkpoint_attention = recompute == 1};
            std::vector<Layout> layouts;
            if (pp == 1) {
              for (int m = 1; m <= options.max_micro_batches && (rows == 0 || m <= rows); m *= 2) {
                Layout l = base;
                l.micro_batches = m;
                layouts.push_back(l);
                if (rows == 0) break;
              }
            } else {
              for (const pipeline::ScheduleKind kind : options.schedules) {
                for (int m = pp; m <= options.max_micro_batches && (rows == 0 || m <= rows);
                     m *= 2) {
                  Layout l = base;
                  l.schedule = kind;
                  l.micro_batches = m;
                  layouts.push_back(l);
                  if (rows == 0) break;
                }
              }
            }
            // Hybrid sharding over a node's dp ranks when dp spans nodes
            // (ParallelLayout: tp innermost, then dp).
            const int node_dp = cluster.devices_per_node / tp;
            const bool hybrid =
                stage > 0 && cluster.nodes > 1 && node_dp >= 2 && node_dp < dp && dp % node_dp == 0;
            for (const Layout& l : layouts) {
              out.push_back(estimate(work, cluster, l));
              if (!hybrid) continue;
              Layout h = l;
              h.zero_shard = node_dp;
              out.push_back(estimate(work, cluster, h));
            }
          }
        }
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Estimate& a, const Estimate& b) {
    if (a.fits() != b.fits()) return a.fits();
    if (a.fits()) {
      if (a.step != b.step) return a.step < b.step;
      return a.total_bytes < b.total_bytes;
    }
    // Refused: memory refusals (they have figures) by their need, the rule
    // refusals after them.
    const bool am = a.total_bytes > 0, bm = b.total_bytes > 0;
    if (am != bm) return am;
    return a.total_bytes < b.total_bytes;
  });
  return out;
}

// NOTE [planner recommendation] The step model leaves out what makes a more
// elaborate layout slower than predicted: a micro-batch's smaller products
// run below the sustained rate, ZeRO-3 re-gathers parameters in every pass,
// a pipeline's messages and tp's collectives have costs beyond bytes over
// bandwidth. So when layouts predict within a few percent of each other the
// difference is not worth their risk, and the simplest of them is
// recommended; the table still lists every fitting layout by predicted step.
size_t recommended(const std::vector<Estimate>& ranked, double tolerance) {
  LOOM_CHECK(tolerance >= 0, "planner: tolerance ", tolerance, " must not be negative");
  size_t best = ranked.size();
  double fastest = 0;
  for (const Estimate& e : ranked) {
    if (e.fits() && (fastest == 0 || e.step < fastest)) fastest = e.step;
  }
  auto simpler = [](const Estimate& a, const Estimate& b) {
    const Layout &x = a.layout, &y = b.layout;
    const auto key = [](const Layout& l) {
      return std::tuple(l.pp, l.tp, recompute_level(l), l.zero_stage, l.zero_shard > 0,
                        l.micro_batches, l.sequence_parallel);
    };
    if (key(x) != key(y)) return key(x) < key(y);
    return a.step < b.step;
  };
  for (size_t i = 0; i < ranked.size(); ++i) {
    const Estimate& e = ranked[i];
    if (!e.fits() || e.step > fastest * (1 + tolerance)) continue;
    if (best == ranked.size() || simpler(e, ranked[best])) best = i;
  }
  return best;
}

}  // namespace loom::parallel::planner
