#include "loom/checkpoint/distributed.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/atomic_file.hpp"
#include "loom/checkpoint/safetensors.hpp"
#include "loom/core/error.hpp"
#include "loom/core/logging.hpp"

namespace loom::checkpoint {
namespace {

using json = nlohmann::json;

constexpr const char* kMetadataKey = "checkpoint";  // in each file's __metadata__
constexpr int kFormat = 1;

std::string rank_file(int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank-%05d.safetensors", rank);
  return name;
}

// Where a parameter's local elements sit in its global tensor.
struct Layout {
  Shape local_shape;
  nn::Placement placement;
  Shape global_shape() const {
    return placement.global_shape.empty() ? local_shape : placement.global_shape;
  }
  // The global shape without the padding (what the checkpoint stores and
  // compares): the padding rows of a padded vocabulary are not the model's.
  Shape model_shape() const {
    Shape s = global_shape();
    if (placement.padding > 0) s[static_cast<size_t>(placement.shard_dim)] -= placement.padding;
    return s;
  }
};

// The index in the unpadded global tensor of padded global index `g`, or -1
// for a padding element (padding is along the shard dimension).
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

Layout layout_from(const json& j) {
  Layout l;
  l.local_shape = j.at("local_shape").get<Shape>();
  l.placement.shard_dim = j.at("shard_dim").get<int>();
  l.placement.shard_offset = j.at("shard_offset").get<int64_t>();
  l.placement.shard_blocks = j.at("shard_blocks").get<int64_t>();
  l.placement.padding = j.value("padding", int64_t{0});
  if (l.placement.shard_dim >= 0) l.placement.global_shape = j.at("global_shape").get<Shape>();
  return l;
}

// Calls run(local, global, n) for the runs of consecutive elements that local
// elements [begin, end) form in the global tensor (row-major both).
template <typename F>
void for_each_run(const Layout& l, int64_t begin, int64_t end, F run) {
  if (begin >= end) return;
  const nn::Placement& p = l.placement;
  if (p.shard_dim < 0) {
    run(begin, begin, end - begin);
    return;
  }
  const Shape global = l.global_shape();
  const auto d = static_cast<size_t>(p.shard_dim);
  int64_t inner = 1;
  for (size_t k = d + 1; k < l.local_shape.size(); ++k) inner *= l.local_shape[k];
  const int64_t rows = l.local_shape[d], global_rows = global[d];
  const int64_t piece = rows / p.shard_blocks, global_piece = global_rows / p.shard_blocks;
  for (int64_t i = begin; i < end;) {
    const int64_t outer = i / (rows * inner), rest = i % (rows * inner);
    const int64_t row = rest / inner, k = rest % inner;
    const int64_t global_row =
        (row / piece) * global_piece + p.shard_offset + row % piece;  // block, then offset
    const int64_t n = std::min(end - i, inner - k);
    run(i, (outer * global_rows + global_row) * inner + k, n);
    i += n;
  }
}

std::string shape_text(const Shape& s) {
  return shape_str(s);
}

// The slot names of the optimizer: "<param>" (stage 0) or "<param>[b:e]".
struct SlotState {
  std::vector<std::pair<std::string, Tensor>> tensors;  // state name -> tensor of the slot
};

std::vector<SlotState> slot_states(const optim::Optimizer& opt) {
  std::vector<SlotState> out(opt.slots().size());
  const std::vector<optim::Optimizer::StateTensor> state = opt.state();
  size_t s = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const std::string prefix = opt.slots()[i].name + ".";
    while (s < state.size() && state[s].name.rfind(prefix, 0) == 0) {
      out[i].tensors.emplace_back(state[s].name.substr(prefix.size()), state[s].tensor);
      ++s;
    }
  }
  LOOM_ASSERT(s == state.size(), "optimizer state tensors are grouped by slot");
  return out;
}

Tensor flat_host(const Tensor& t, int64_t begin, int64_t end) {
  const Tensor flat = t.flat_view(begin, {end - begin});
  return flat.device().is_cpu() ? flat.clone() : flat.to(Device::cpu());
}

// The record of a file: which parameter, which kind ("value" or a state
// name), which local elements, laid out how.
struct Record {
  std::string file;
  std::string param, kind;
  int64_t begin = 0, end = 0;
  Layout layout;
  const Tensor* tensor = nullptr;
};

// A parameter's global tensor of one kind, assembled from its records.
std::vector<float> assemble(const std::vector<const Record*>& records, const std::string& param,
                            const std::string& kind, const Shape& global_shape) {
  const int64_t numel = shape_numel(global_shape);
  std::vector<float> out(static_cast<size_t>(numel));
  std::vector<uint8_t> seen(static_cast<size_t>(numel), 0);
  for (const Record* r : records) {
    if (r->kind != kind) continue;
    LOOM_CHECK(r->layout.model_shape() == global_shape, "checkpoint file ", r->file,
               ": parameter '", param, "' has global shape ", shape_text(r->layout.model_shape()),
               " but the model's is ", shape_text(global_shape),
               " (a checkpoint of another model?)");
    const float* data = r->tensor->data<float>();
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

// Copies local elements [begin, end) of a parameter laid out as `l` from its
// global tensor into `dst` (begin..end of the local flat tensor).
void scatter_to(const std::vector<float>& global, const Layout& l, int64_t begin, int64_t end,
                const Tensor& dst) {
  std::vector<float> local(static_cast<size_t>(end - begin), 0.0f);  // padding stays zero
  for_each_run(l, begin, end, [&](int64_t i, int64_t g, int64_t n) {
    const int64_t from = unpadded(l, g);
    if (from < 0) return;
    std::copy(global.begin() + from, global.begin() + from + n, local.begin() + (i - begin));
  });
  dst.copy_from(Tensor::from_vector(local, dst.shape(), Device::cpu()).to(dst.device()));
}

}  // namespace

std::filesystem::path step_directory(const std::filesystem::path& dir, int64_t step) {
  LOOM_CHECK(step >= 0, "checkpoint step ", step, " must not be negative");
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return dir / name;
}

std::filesystem::path save_checkpoint(const std::filesystem::path& dir, comm::Communicator& world,
                                      parallel::ZeroOptimizer& zero, const TrainingState& state,
                                      const SaveOptions& options) {
  const std::filesystem::path step_dir = step_directory(dir, state.step);
  std::filesystem::create_directories(step_dir);
  const int stage = zero.stage();
  // Stages 1 and 2 all-gather the parameters after step() without waiting:
  // the values are complete only once that has finished.
  if (stage == 3) {
    zero.gather_parameters();
  } else {
    zero.wait_parameters();
  }
  optim::Optimizer& opt = zero.optimizer();
  const std::vector<parallel::ShardPiece> pieces = zero.shard_pieces(options.dp_rank);
  const std::vector<SlotState> states = slot_states(opt);
  LOOM_ASSERT(states.size() == pieces.size(), "one optimizer slot per shard piece");
  const int dp_size = std::max(1, zero.data_parallel_size());

  std::vector<StoredTensor> tensors;
  json records = json::array();
  for (size_t i = 0; i < pieces.size(); ++i) {
    const parallel::ShardPiece& piece = pieces[i];
    nn::Parameter& p = *piece.param;
    // Stage 0: every dp rank holds every parameter whole; each writes its share.
    if (stage == 0 && static_cast<int>(i % static_cast<size_t>(dp_size)) != options.dp_rank) {
      continue;
    }
    if (!p.sharded() && !options.write_replicated) continue;
    LOOM_CHECK(p.dtype() == DType::f32, "save_checkpoint: parameter '", p.name(), "' is ",
               p.dtype(), "; checkpoints of f32 parameters only so far");
    const Layout layout{p.shape(), p.placement()};
    auto add = [&](const std::string& kind, Tensor host) {
      const std::string name = str_cat(p.name(), "@", piece.begin, ":", piece.end, ".", kind);
      records.push_back({{"tensor", name},
                         {"param", p.name()},
                         {"kind", kind},
                         {"begin", piece.begin},
                         {"end", piece.end},
                         {"layout", layout_json(layout)}});
      tensors.push_back({name, std::move(host), std::nullopt});
    };
    add("value", flat_host(p.value(), piece.begin, piece.end));
    // The slot's state is this piece (stages 1-3) or the whole parameter (stage 0).
    for (const auto& [kind, tensor] : states[i].tensors) {
      const int64_t offset = stage == 0 ? piece.begin : 0;
      add(kind, flat_host(tensor, offset, offset + (piece.end - piece.begin)));
    }
  }
  const json meta = {{"format", kFormat},
                     {"rank", world.rank()},
                     {"world", world.size()},
                     {"step", state.step},
                     {"optimizer_steps", opt.step_count()},
                     {"records", records}};
  save_safetensors(step_dir / rank_file(world.rank()), tensors, {{kMetadataKey, meta.dump()}});
  if (stage == 3) zero.release_parameters();

  if (options.before_manifest) options.before_manifest();
  // NOTE: the manifest makes the checkpoint exist, so it is written last.
  world.barrier().wait();
  if (world.rank() == 0) {
    json files = json::array();
    for (int r = 0; r < world.size(); ++r) files.push_back(rank_file(r));
    const json manifest = {{"format", kFormat},
                           {"step", state.step},
                           {"world", world.size()},
                           {"files", files},
                           {"info", state.info}};
    detail::write_file_atomically(step_dir / "manifest.json", "checkpoint manifest",
                                  manifest.dump(2) + "\n");
  }
  world.barrier().wait();
  return step_dir;
}

std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& dir) {
  std::optional<std::filesystem::path> best;
  if (!std::filesystem::is_directory(dir)) return best;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind("step-", 0) != 0) continue;
    if (!std::filesystem::exists(entry.path() / "manifest.json")) continue;  // incomplete
    if (!best || name > best->filename().string()) best = entry.path();
  }
  return best;
}

struct CheckpointReader::Impl {
  std::filesystem::path dir;
  TrainingState state;
  int world = 0;
  int64_t optimizer_steps = -1;
  std::vector<std::string> names;
  std::vector<SafetensorsFile> files;
  std::vector<Record> records;
  std::map<std::string, std::vector<const Record*>> by_param;
  std::map<std::string, ParamInfo> params;
};

CheckpointReader::CheckpointReader(const std::filesystem::path& step_dir)
    : impl_(std::make_unique<Impl>()) {
  Impl& c = *impl_;
  c.dir = step_dir;
  const std::filesystem::path manifest_path = step_dir / "manifest.json";
  LOOM_CHECK(std::filesystem::exists(manifest_path), "checkpoint ", step_dir,
             " has no manifest.json: it is incomplete (the save did not finish) or not a "
             "checkpoint");
  json manifest;
  try {
    std::ifstream in(manifest_path);
    manifest = json::parse(in);
  } catch (const std::exception& e) {
    throw Error(str_cat("checkpoint manifest ", manifest_path, " is not valid JSON: ", e.what()));
  }
  try {
    LOOM_CHECK(manifest.value("format", 0) == kFormat, "checkpoint manifest ", manifest_path,
               ": format ", manifest.value("format", 0), " is not ", kFormat);
    c.state.step = manifest.at("step").get<int64_t>();
    c.state.info = manifest.at("info").get<std::map<std::string, std::string>>();
    c.world = manifest.at("world").get<int>();
    c.names = manifest.at("files").get<std::vector<std::string>>();
    LOOM_CHECK(static_cast<int>(c.names.size()) == c.world, "checkpoint manifest ", manifest_path,
               " lists ", c.names.size(), " files for a world of ", c.world, " ranks");
    for (const std::string& name : c.names) {
      const std::filesystem::path path = step_dir / name;
      LOOM_CHECK(std::filesystem::exists(path), "checkpoint ", step_dir, ": file ", name,
                 " listed in its manifest is missing");
      c.files.push_back(load_safetensors(path));
    }
    for (size_t f = 0; f < c.files.size(); ++f) {
      const std::string& file = c.names[f];
      const auto it = c.files[f].metadata.find(kMetadataKey);
      LOOM_CHECK(it != c.files[f].metadata.end(), "checkpoint file ", file,
                 " has no Loom checkpoint metadata");
      const json meta = json::parse(it->second);
      LOOM_CHECK(meta.at("step").get<int64_t>() == c.state.step, "checkpoint file ", file,
                 " is of step ", meta.at("step").get<int64_t>(), ", the manifest of step ",
                 c.state.step);
      c.optimizer_steps = meta.at("optimizer_steps").get<int64_t>();
      for (const json& r : meta.at("records")) {
        Record rec{file,
                   r.at("param").get<std::string>(),
                   r.at("kind").get<std::string>(),
                   r.at("begin").get<int64_t>(),
                   r.at("end").get<int64_t>(),
                   layout_from(r.at("layout")),
                   &c.files[f].at(r.at("tensor").get<std::string>()).tensor};
        const Shape global = rec.layout.global_shape();
        LOOM_CHECK(rec.begin >= 0 && rec.begin <= rec.end &&
                       rec.end <= shape_numel(rec.layout.local_shape) &&
                       rec.tensor->numel() == rec.end - rec.begin &&
                       rec.tensor->dtype() == DType::f32 &&
                       global.size() == rec.layout.local_shape.size(),
                   "checkpoint file ", file, ": record '", r.at("tensor").get<std::string>(),
                   "' does not fit its parameter's shape");
        c.records.push_back(std::move(rec));
      }
    }
  } catch (const json::exception& e) {
    throw Error(str_cat("checkpoint ", step_dir, ": malformed metadata: ", e.what()));
  }
  for (const Record& r : c.records) {
    c.by_param[r.param].push_back(&r);
    ParamInfo& info = c.params[r.param];
    if (info.records == 0) info.global_shape = r.layout.model_shape();
    LOOM_CHECK(info.global_shape == r.layout.model_shape(), "checkpoint file ", r.file,
               ": parameter '", r.param, "' has global shape ", shape_text(r.layout.model_shape()),
               " here and ", shape_text(info.global_shape), " in another record");
    if (std::find(info.kinds.begin(), info.kinds.end(), r.kind) == info.kinds.end()) {
      info.kinds.push_back(r.kind);
    }
    ++info.records;
    info.bytes += static_cast<int64_t>(r.tensor->nbytes());
  }
}

CheckpointReader::~CheckpointReader() = default;

const TrainingState& CheckpointReader::state() const {
  return impl_->state;
}
int CheckpointReader::world() const {
  return impl_->world;
}
const std::vector<std::string>& CheckpointReader::files() const {
  return impl_->names;
}
int64_t CheckpointReader::optimizer_steps() const {
  return impl_->optimizer_steps;
}
const std::map<std::string, CheckpointReader::ParamInfo>& CheckpointReader::params() const {
  return impl_->params;
}

Tensor CheckpointReader::assemble(const std::string& param, const std::string& kind) const {
  const auto it = impl_->params.find(param);
  LOOM_CHECK(it != impl_->params.end(), "checkpoint ", impl_->dir, " has no parameter '", param,
             "'");
  const Shape& shape = it->second.global_shape;
  return Tensor::from_vector(
      loom::checkpoint::assemble(impl_->by_param.at(param), param, kind, shape), shape);
}

TrainingState load_checkpoint(const std::filesystem::path& step_dir, parallel::ZeroOptimizer& zero,
                              int dp_rank) {
  const CheckpointReader reader(step_dir);
  const CheckpointReader::Impl& c = reader.impl();
  const auto& by_param = c.by_param;
  const TrainingState state = c.state;
  const int64_t optimizer_steps = c.optimizer_steps;
  const int stage = zero.stage();
  optim::Optimizer& opt = zero.optimizer();
  const std::vector<parallel::ShardPiece> pieces = zero.shard_pieces(dp_rank);
  const std::vector<SlotState> states = slot_states(opt);
  // Check every parameter first, so that nothing changes when one is missing.
  for (nn::Parameter* p : zero.parameters()) {
    LOOM_CHECK(by_param.count(p->name()) > 0, "checkpoint ", step_dir, ": parameter '", p->name(),
               "' of the model is in no file (a checkpoint of another model?)");
  }
  for (nn::Parameter* p : zero.parameters()) {
    const Layout mine{p->shape(), p->placement()};
    const std::vector<const Record*>& mine_records = by_param.at(p->name());
    const std::vector<float> value = assemble(mine_records, p->name(), "value", mine.model_shape());
    if (stage != 3) {
      scatter_to(value, mine, 0, p->numel(), p->value());
    }
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (pieces[i].param != p) continue;
      // At stage 3 the value at rest is the slot's (this rank's piece).
      if (stage == 3) {
        scatter_to(value, mine, pieces[i].begin, pieces[i].end, opt.slots()[i].current_value());
      }
      for (const auto& [kind, tensor] : states[i].tensors) {
        const std::vector<float> global =
            assemble(mine_records, p->name(), kind, mine.model_shape());
        const Tensor flat = stage == 0 ? tensor.flat_view(0, {tensor.numel()}) : tensor;
        scatter_to(global, mine, pieces[i].begin, pieces[i].end, flat);
      }
    }
  }
  if (optimizer_steps >= 0) opt.set_step_count(optimizer_steps);
  return state;
}

}  // namespace loom::checkpoint
