// The records of a distributed checkpoint: layouts to and from JSON, the map
// from a record's local elements to the global tensor, and a global tensor
// assembled from its records (checkpoint/records.hpp).
#include "checkpoint/records.hpp"

#include <algorithm>
#include <limits>

#include "loom/core/error.hpp"

namespace loom::checkpoint::on_disk {

using json = nlohmann::json;

namespace {

// A shape field: non-negative integers whose product fits in int64.
Shape shape_field(const json& j, const std::string& where, const char* key) {
  const json& v = j.at(key);
  LOOM_CHECK(v.is_array(), where, ": \"", key, "\" is ", v.dump(), ", not an array");
  Shape shape;
  int64_t numel = 1;
  for (const json& d : v) {
    const bool ok =
        d.is_number_integer() &&
        (d.is_number_unsigned()
             ? d.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
             : d.get<int64_t>() >= 0);
    LOOM_CHECK(ok, where, ": \"", key, "\" is ", v.dump(), ", not non-negative integers");
    shape.push_back(d.get<int64_t>());
    LOOM_CHECK(!__builtin_mul_overflow(numel, shape.back(), &numel), where, ": \"", key, "\" ",
               v.dump(), " has more elements than int64 counts");
  }
  return shape;
}

}  // namespace

int64_t integer(const json& j, const std::string& where, const char* key) {
  const json& v = j.at(key);
  const bool in_range =
      v.is_number_integer() &&
      (!v.is_number_unsigned() ||
       v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
  LOOM_CHECK(in_range, where, ": \"", key, "\" is ", v.dump(), ", not an integer");
  return v.get<int64_t>();
}

int64_t unpadded(const Layout& l, int64_t g) {
  if (l.placement.padding == 0) return g;
  const Shape global = l.global_shape();
  const auto d = static_cast<size_t>(l.placement.shard_dim);
  int64_t inner = 1;
  for (size_t k = d + 1; k < global.size(); ++k) inner *= global[k];
  const int64_t rows = global[d], real = rows - l.placement.padding;
  const int64_t outer = g / (rows * inner), row = (g % (rows * inner)) / inner, k = g % inner;
  if (row >= real) return -1;
  return (outer * real + row) * inner + k;
}

json layout_json(const Layout& l) {
  return {{"local_shape", l.local_shape},
          {"global_shape", l.global_shape()},
          {"shard_dim", l.placement.shard_dim},
          {"shard_offset", l.placement.shard_offset},
          {"shard_blocks", l.placement.shard_blocks},
          {"padding", l.placement.padding}};
}

Layout layout_from(const json& j, const std::string& where) {
  Layout l;
  l.local_shape = shape_field(j, where, "local_shape");
  const auto rank = static_cast<int64_t>(l.local_shape.size());
  const int64_t dim = integer(j, where, "shard_dim");
  LOOM_CHECK(dim >= -1 && dim < rank, where, ": shard_dim ", dim, " is not -1 or a dimension of ",
             "the local shape ", shape_str(l.local_shape));
  l.placement.shard_dim = static_cast<int>(dim);
  l.placement.shard_offset = integer(j, where, "shard_offset");
  l.placement.shard_blocks = integer(j, where, "shard_blocks");
  l.placement.padding = j.contains("padding") ? integer(j, where, "padding") : 0;
  if (dim < 0) {
    LOOM_CHECK(l.placement.padding == 0, where, ": padding ", l.placement.padding,
               " on a parameter that is not sharded (shard_dim -1)");
    return l;
  }
  // Sharded: whole along every other dimension, `blocks` equal blocks along
  // shard_dim, each holding [offset, offset + rows / blocks) of its block.
  const Shape global = shape_field(j, where, "global_shape");
  const auto d = static_cast<size_t>(dim);
  bool same_elsewhere = global.size() == l.local_shape.size();
  for (size_t k = 0; same_elsewhere && k < global.size(); ++k) {
    same_elsewhere = k == d || global[k] == l.local_shape[k];
  }
  LOOM_CHECK(same_elsewhere, where, ": local shape ", shape_str(l.local_shape),
             " is not a shard of global shape ", shape_str(global), " along dimension ", dim);
  const int64_t blocks = l.placement.shard_blocks, rows = l.local_shape[d];
  LOOM_CHECK(blocks >= 1 && rows % blocks == 0 && global[d] % blocks == 0, where, ": shard_blocks ",
             blocks, " does not divide the local ", rows, " and the global ", global[d],
             " rows of dimension ", dim);
  const int64_t offset = l.placement.shard_offset;
  LOOM_CHECK(offset >= 0 && offset <= global[d] / blocks - rows / blocks, where, ": shard_offset ",
             offset, " with ", rows / blocks, " rows per block does not fit the ",
             global[d] / blocks, " rows of a global block");
  LOOM_CHECK(l.placement.padding >= 0 && l.placement.padding <= global[d], where, ": padding ",
             l.placement.padding, " is not within the ", global[d], " global rows");
  l.placement.global_shape = global;
  return l;
}

const Tensor& Record::values() const {
  if (!cached.defined()) cached = read_safetensors_tensor(*index, tensor).tensor;
  return cached;
}

namespace {

// Every record of `kind` has the model's global shape (a checkpoint of another model otherwise).
void check_global_shape(const std::vector<const Record*>& records, const std::string& param,
                        const std::string& kind, const Shape& global_shape) {
  for (const Record* r : records) {
    if (r->kind != kind) continue;
    LOOM_CHECK(r->layout.model_shape() == global_shape, "checkpoint file ", r->file,
               ": parameter '", param, "' has global shape ", shape_str(r->layout.model_shape()),
               " but the model's is ", shape_str(global_shape),
               " (a checkpoint of another model?)");
  }
}

// A run of consecutive elements of the unpadded global tensor.
struct Run {
  int64_t global = 0, n = 0, local = 0;  // local: where it starts in the caller's numbering
};

}  // namespace

void check_complete(const std::vector<const Record*>& records, const std::string& param,
                    const std::string& kind, const Shape& global_shape) {
  const int64_t numel = shape_numel(global_shape);
  std::vector<std::pair<int64_t, int64_t>> runs;  // [begin, end) in the unpadded global tensor
  for (const Record* r : records) {
    if (r->kind != kind) continue;
    for_each_run(r->layout, r->begin, r->end, [&](int64_t, int64_t global, int64_t n) {
      const int64_t to = unpadded(r->layout, global);  // a run is padding as a whole or not at all
      if (to >= 0) runs.emplace_back(to, to + n);
    });
  }
  std::sort(runs.begin(), runs.end());
  int64_t covered = 0;  // [0, covered) is held by some record
  for (const auto& [begin, end] : runs) {
    if (begin > covered) break;
    covered = std::max(covered, end);
  }
  LOOM_CHECK(covered >= numel, "checkpoint: parameter '", param, "' (", kind, ") element ", covered,
             " of ", numel, " is in no file of the checkpoint (an incomplete checkpoint?)");
}

std::vector<float> read_local(const std::vector<const Record*>& records, const std::string& param,
                              const std::string& kind, const Layout& mine, int64_t begin,
                              int64_t end) {
  check_global_shape(records, param, kind, mine.model_shape());
  // The runs this rank needs, by global position.
  std::vector<Run> needed;
  for_each_run(mine, begin, end, [&](int64_t local, int64_t global, int64_t n) {
    const int64_t to = unpadded(mine, global);
    if (to >= 0) needed.push_back({to, n, local - begin});
  });
  std::sort(needed.begin(), needed.end(),
            [](const Run& a, const Run& b) { return a.global < b.global; });
  std::vector<float> out(static_cast<size_t>(end - begin), 0.0f);   // padding stays zero
  std::vector<uint8_t> seen(out.size(), 0), wanted(out.size(), 0);  // wanted: not padding
  for (const Run& run : needed) std::fill_n(wanted.begin() + run.local, run.n, 1);
  // Copies (from the record's element, to ours, count), found from layouts alone.
  struct Copy {
    int64_t from = 0, to = 0, n = 0;
  };
  for (const Record* r : records) {
    if (r->kind != kind) continue;
    std::vector<Copy> copies;
    for_each_run(r->layout, r->begin, r->end, [&](int64_t local, int64_t global, int64_t n) {
      const int64_t g = unpadded(r->layout, global);
      if (g < 0) return;
      // The needed runs that overlap [g, g + n): from the last one starting at or before g.
      auto it = std::upper_bound(needed.begin(), needed.end(), g,
                                 [](int64_t x, const Run& run) { return x < run.global; });
      if (it != needed.begin()) --it;
      for (; it != needed.end() && it->global < g + n; ++it) {
        const int64_t lo = std::max(g, it->global), hi = std::min(g + n, it->global + it->n);
        if (lo >= hi) continue;
        copies.push_back({local - r->begin + (lo - g), it->local + (lo - it->global), hi - lo});
      }
    });
    if (copies.empty()) continue;  // nothing of ours: not read
    const float* data = r->values().data<float>();
    for (const Copy& c : copies) {
      std::copy(data + c.from, data + c.from + c.n, out.begin() + c.to);
      std::fill_n(seen.begin() + c.to, c.n, 1);
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    LOOM_CHECK(!wanted[i] || seen[i], "checkpoint: parameter '", param, "' (", kind,
               ") local element ", begin + static_cast<int64_t>(i),
               " is in no file of the checkpoint (an incomplete checkpoint?)");
  }
  return out;
}

std::vector<float> assemble(const std::vector<const Record*>& records, const std::string& param,
                            const std::string& kind, const Shape& global_shape) {
  const int64_t numel = shape_numel(global_shape);
  // Records hold at most this many elements: fewer than the tensor's leave a
  // hole, found here before the tensor is allocated (a corrupt global shape
  // may ask for more memory than there is).
  int64_t stored = 0;
  for (const Record* r : records) {
    if (r->kind == kind) stored += r->end - r->begin;
  }
  check_global_shape(records, param, kind, global_shape);
  LOOM_CHECK(stored >= numel, "checkpoint: parameter '", param, "' (", kind, ") has ", numel,
             " elements, but its records hold ", stored, " (an incomplete checkpoint?)");
  std::vector<float> out(static_cast<size_t>(numel));
  std::vector<uint8_t> seen(static_cast<size_t>(numel), 0);
  for (const Record* r : records) {
    if (r->kind != kind) continue;
    const float* data = r->values().data<float>();
    for_each_run(r->layout, r->begin, r->end, [&](int64_t local, int64_t global, int64_t n) {
      // A run lies within one row: padding as a whole or not at all.
      const int64_t to = unpadded(r->layout, global);
      if (to < 0) return;
      std::copy(data + (local - r->begin), data + (local - r->begin) + n, out.begin() + to);
      std::fill(seen.begin() + to, seen.begin() + to + n, 1);
    });
  }
  const auto missing = std::find(seen.begin(), seen.end(), 0);
  LOOM_CHECK(missing == seen.end(), "checkpoint: parameter '", param, "' (", kind, ") element ",
             missing - seen.begin(), " of ", numel,
             " is in no file of the checkpoint (an incomplete checkpoint?)");
  return out;
}

}  // namespace loom::checkpoint::on_disk
