#include "loom/checkpoint/distributed.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string_view>
#include <vector>

#include "checkpoint/records.hpp"
#include "checkpoint/save_parts.hpp"
#include "core/atomic_file.hpp"
#include "loom/checkpoint/gpt2.hpp"
#include "loom/checkpoint/safetensors.hpp"
#include "loom/core/error.hpp"
#include "loom/core/logging.hpp"

namespace loom::checkpoint {

std::string SaveReport::summary() const {
  char text[512];
  std::snprintf(text, sizeof(text),
                "checkpoint %s complete: training stalled %.1f ms (copy to host %.1f ms); rank 0 "
                "wrote %.1f MiB in %.1f ms (%.0f MiB/s); complete %.1f ms after the save began",
                step_dir.string().c_str(), stall_seconds * 1e3, copy_seconds * 1e3,
                static_cast<double>(bytes) / (1 << 20), write_seconds * 1e3,
                write_bandwidth() / (1 << 20), complete_seconds * 1e3);
  return text;
}

std::string saving::rank_file(int rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "rank-%05d.safetensors", rank);
  return name;
}

namespace {

using saving::rank_file;

using json = nlohmann::json;
using on_disk::Layout;

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

// Elements [begin, end) of `t` in host memory as f32 (every record is f32;
// bf16/f16 widen exactly): copied into `into` when it is a host f32 tensor of
// that size (memory already mapped), else fresh.
Tensor flat_host(const Tensor& t, int64_t begin, int64_t end, const Tensor& into = {}) {
  const Tensor flat = t.flat_view(begin, {end - begin});
  if (into.defined() && into.device().is_cpu() && into.dtype() == DType::f32 &&
      into.numel() == flat.numel()) {
    into.copy_from(flat);
    return into;
  }
  const Tensor host = flat.device().is_cpu() ? flat : flat.to(Device::cpu());
  return host.dtype() == DType::f32 ? host.clone() : host.to(DType::f32);
}

// NOTE [master records] A bf16/f16 parameter at ZeRO stages 1 to 3 has an f32
// master per slot (ZeroOptimizer: the slot steps it, the value is its
// rounding): its records hold the value (widened, exact) and, as kind
// "master", the master. Loading one into a model that keeps masters restores
// both; a parameter without master records (saved as f32, or at stage 0)
// gives its masters the values, as ZeroOptimizer starts them; an f32 model
// takes the masters as its values where the checkpoint has them (the
// precise weights of a low-precision run). A low-precision model at stage 0
// keeps no master and takes the values.
constexpr const char* kMaster = "master";
constexpr const char* kBuffer = "buffer";  // NOTE [buffer records]

bool keeps_master(const optim::ParamSlot& slot, const nn::Parameter& p) {
  return slot.current_value().dtype() != p.dtype();
}

// `values` into `dst` (any device), which has as many elements.
void copy_into(const std::vector<float>& values, const Tensor& dst) {
  dst.copy_from(Tensor::from_vector(values, dst.shape(), Device::cpu()).to(dst.device()));
}

// NOTE [buffer records]: every buffer is in the checkpoint, with its shape
// (checked before anything is loaded)...
void check_buffers(const CheckpointReader::Impl& c, const std::vector<nn::Buffer>& buffers) {
  for (const nn::Buffer& b : buffers) {
    const auto it = c.params.find(b.name);
    LOOM_CHECK(it != c.params.end() && std::find(it->second.kinds.begin(), it->second.kinds.end(),
                                                 kBuffer) != it->second.kinds.end(),
               "checkpoint ", c.dir, ": buffer '", b.name,
               "' of the model is in no file (saved without SaveOptions::buffers, or of another "
               "model?)");
    LOOM_CHECK(it->second.global_shape == b.value.shape(), "checkpoint ", c.dir, ": buffer '",
               b.name, "' was saved as ", shape_str(it->second.global_shape),
               " where the model has ", shape_str(b.value.shape()));
  }
}

// ... and is copied whole into the module's tensor.
void load_buffers(const CheckpointReader::Impl& c, const std::vector<nn::Buffer>& buffers) {
  for (const nn::Buffer& b : buffers) {
    const std::vector<const on_disk::Record*>& records = c.by_param.at(b.name);
    copy_into(on_disk::read_local(records, b.name, kBuffer,
                                  Layout{b.value.shape(), nn::Placement{}}, 0, b.value.numel()),
              b.value);
    for (const on_disk::Record* r : records) r->release();
  }
}

// Runs `load` on this rank of `world`, then agrees with the others on the
// outcome before any goes on: when a rank failed, every rank throws naming
// the lowest failing rank and its error, so no rank trains on a partly
// loaded state. `what` names what was loaded.
template <typename Load>
auto load_agreed(comm::Communicator& world, const std::string& what, Load load) {
  decltype(load()) result{};
  std::string error;
  try {
    result = load();
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "an error without a message";
  }
  // The lowest failing rank, or the world size when every rank loaded.
  const Tensor failed = Tensor::full({1}, error.empty() ? world.size() : world.rank(), DType::i32);
  world.all_reduce(failed, {.op = comm::ReduceOp::min}).wait();
  const int root = static_cast<int>(failed.to_vector<int32_t>()[0]);
  if (root == world.size()) return result;
  // Its message, one character per element.
  const Tensor length = Tensor::full({1}, static_cast<double>(error.size()), DType::i32);
  world.broadcast(length, {.root = root}).wait();
  const auto n = static_cast<int64_t>(length.to_vector<int32_t>()[0]);
  std::vector<int32_t> chars(error.begin(), error.end());
  chars.resize(static_cast<size_t>(n));
  const Tensor text = Tensor::from_vector(chars, {n});
  world.broadcast(text, {.root = root}).wait();
  if (!error.empty() && world.rank() == root) throw Error(error);
  const std::vector<int32_t> received = text.to_vector<int32_t>();
  throw Error(str_cat(
      what, ": rank ", root, " of group '", world.name(),
      "' could not load it, so no rank goes on: ", std::string(received.begin(), received.end())));
}

}  // namespace

std::filesystem::path step_directory(const std::filesystem::path& dir, int64_t step) {
  LOOM_CHECK(step >= 0, "checkpoint step ", step, " must not be negative");
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  return dir / name;
}

namespace saving {

RankSnapshot snapshot_rank(const std::filesystem::path& dir, const comm::Communicator& world,
                           parallel::ZeroOptimizer& zero, const TrainingState& state,
                           const SaveOptions& options, const std::vector<Tensor>& reuse) {
  RankSnapshot snap;
  snap.step_dir = step_directory(dir, state.step);
  snap.rank = world.rank();
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

  json records = json::array();
  // The next host buffer of an earlier snapshot, if any.
  auto spare = [&]() -> Tensor {
    const size_t k = snap.tensors.size();
    return k < reuse.size() ? reuse[k] : Tensor();
  };
  // Elements [begin, end) of `param` (laid out as `layout`, of dtype `dtype`)
  // of one kind, as a record.
  auto add_record = [&](const std::string& param, const std::string& kind, int64_t begin,
                        int64_t end, DType dtype, const Layout& layout, Tensor host) {
    const std::string name = str_cat(param, "@", begin, ":", end, ".", kind);
    records.push_back({{"tensor", name},
                       {"param", param},
                       {"kind", kind},
                       {"begin", begin},
                       {"end", end},
                       // The parameter's own dtype (every record is stored as f32).
                       {"dtype", std::string(dtype_name(dtype))},
                       {"layout", on_disk::layout_json(layout)}});
    snap.bytes += static_cast<int64_t>(host.nbytes());
    snap.tensors.push_back({name, std::move(host), std::nullopt});
  };
  for (size_t i = 0; i < pieces.size(); ++i) {
    const parallel::ShardPiece& piece = pieces[i];
    nn::Parameter& p = *piece.param;
    // Stage 0: every dp rank holds every parameter whole; each writes its share.
    if (stage == 0 && static_cast<int>(i % static_cast<size_t>(dp_size)) != options.dp_rank) {
      continue;
    }
    if (!p.sharded() && !options.write_replicated) continue;
    // Hybrid sharding: the other replicas hold the same pieces as the first.
    if (stage > 0 && zero.replica_rank() > 0) continue;
    const Layout layout{p.shape(), p.placement()};
    auto add = [&](const std::string& kind, Tensor host) {
      add_record(p.name(), kind, piece.begin, piece.end, p.dtype(), layout, std::move(host));
    };
    add("value", flat_host(p.value(), piece.begin, piece.end, spare()));
    if (stage > 0 && keeps_master(opt.slots()[i], p)) {  // NOTE [master records]
      const Tensor& master = opt.slots()[i].current_value();
      add(kMaster, flat_host(master, 0, master.numel(), spare()));
    }
    // The slot's state is this piece (stages 1-3) or the whole parameter (stage 0).
    for (const auto& [kind, tensor] : states[i].tensors) {
      const int64_t offset = stage == 0 ? piece.begin : 0;
      add(kind, flat_host(tensor, offset, offset + (piece.end - piece.begin), spare()));
    }
  }
  if (stage == 3) zero.release_parameters();
  // NOTE [buffer records] Buffers (BatchNorm's running statistics) are whole
  // and the same on every replica (per-rank BatchNorm: dp rank 0's are kept):
  // written by dp rank 0 of the first replica, where it writes replicated
  // parameters, as records of kind "buffer".
  if (options.dp_rank == 0 && options.write_replicated && zero.replica_rank() == 0) {
    for (const nn::Buffer& b : options.buffers) {
      add_record(b.name, kBuffer, 0, b.value.numel(), b.value.dtype(),
                 Layout{b.value.shape(), nn::Placement{}},
                 flat_host(b.value, 0, b.value.numel(), spare()));
    }
  }
  snap.metadata = json{
      {"format", on_disk::kFormat},
      {"rank", world.rank()},
      {"world", world.size()},
      {"step", state.step},
      {"optimizer_steps", opt.step_count()},
      {"records",
       records}}.dump();
  return snap;
}

void write_rank_file(const RankSnapshot& snapshot) {
  save_safetensors(snapshot.step_dir / rank_file(snapshot.rank), snapshot.tensors,
                   {{on_disk::kMetadataKey, snapshot.metadata}});
}

void write_manifest(const std::filesystem::path& step_dir, int world, const TrainingState& state) {
  json files = json::array();
  for (int r = 0; r < world; ++r) files.push_back(rank_file(r));
  const json manifest = {{"format", on_disk::kFormat},
                         {"step", state.step},
                         {"world", world},
                         {"files", files},
                         {"info", state.info}};
  loom::detail::write_file_atomically(step_dir / "manifest.json", "checkpoint manifest",
                                      manifest.dump(2) + "\n");
}

}  // namespace saving

std::filesystem::path save_checkpoint(const std::filesystem::path& dir, comm::Communicator& world,
                                      parallel::ZeroOptimizer& zero, const TrainingState& state,
                                      const SaveOptions& options) {
  const std::filesystem::path step_dir = step_directory(dir, state.step);
  std::filesystem::create_directories(step_dir);
  saving::write_rank_file(saving::snapshot_rank(dir, world, zero, state, options));
  if (options.before_manifest) options.before_manifest();
  // NOTE: the manifest makes the checkpoint exist, so it is written last.
  world.barrier().wait();
  if (world.rank() == 0) saving::write_manifest(step_dir, world.size(), state);
  world.barrier().wait();
  return step_dir;
}

TrainingState load_checkpoint(const std::filesystem::path& step_dir, parallel::ZeroOptimizer& zero,
                              int dp_rank, const std::vector<nn::Buffer>& buffers) {
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
  check_buffers(c, buffers);
  // An all-gather step() left in flight (stages 1, 2) would write over what is loaded.
  zero.wait_parameters();
  // NOTE [records read on demand] (records.hpp): each piece this rank keeps
  // is read from the records that hold it, nothing else.
  const std::vector<Tensor> values = zero.value_shards();
  for (nn::Parameter* p : zero.parameters()) {
    const Layout mine{p->shape(), p->placement()};
    const std::vector<const on_disk::Record*>& mine_records = by_param.at(p->name());
    const auto read = [&](const std::string& kind, int64_t begin, int64_t end) {
      return on_disk::read_local(mine_records, p->name(), kind, mine, begin, end);
    };
    // NOTE [master records]: the precise weights, where they were saved.
    const std::vector<std::string>& kinds = c.params.at(p->name()).kinds;
    const bool saved_master = std::find(kinds.begin(), kinds.end(), kMaster) != kinds.end();
    const std::string value_kind = p->dtype() == DType::f32 && saved_master ? kMaster : "value";
    if (stage != 3) copy_into(read(value_kind, 0, p->numel()), p->value());
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (pieces[i].param != p) continue;
      const int64_t begin = pieces[i].begin, end = pieces[i].end;
      // At stage 3 the value at rest is this rank's piece of the shard.
      if (stage == 3) copy_into(read(value_kind, begin, end), values[i]);
      if (stage > 0 && keeps_master(opt.slots()[i], *p)) {
        copy_into(read(saved_master ? kMaster : "value", begin, end),
                  opt.slots()[i].current_value());
      }
      for (const auto& [kind, tensor] : states[i].tensors) {
        copy_into(read(kind, begin, end),
                  stage == 0 ? tensor.flat_view(0, {tensor.numel()}) : tensor);
      }
    }
    for (const on_disk::Record* r : mine_records) r->release();
  }
  load_buffers(c, buffers);
  if (optimizer_steps >= 0) opt.set_step_count(optimizer_steps);
  return state;
}

TrainingState load_checkpoint_weights(const std::filesystem::path& step_dir, nn::Module& model) {
  const CheckpointReader reader(step_dir);
  const CheckpointReader::Impl& c = reader.impl();
  const std::vector<nn::Parameter*> params = model.parameters();
  for (const nn::Parameter* p : params) {
    LOOM_CHECK(c.by_param.count(p->name()) > 0, "checkpoint ", step_dir, ": parameter '", p->name(),
               "' of the model is in no file (a checkpoint of another model?)");
    const Shape saved = c.params.at(p->name()).global_shape;
    const Shape wanted = Layout{p->shape(), p->placement()}.model_shape();
    LOOM_CHECK(saved == wanted, "checkpoint ", step_dir, ": parameter '", p->name(),
               "' was saved as ", shape_str(saved), " where the model needs ", shape_str(wanted),
               ": the model's sizes (vocabulary, layers, width, sequence) must be the run's");
  }
  const std::vector<nn::Buffer> buffers = model.buffers();
  check_buffers(c, buffers);
  load_buffers(c, buffers);
  for (nn::Parameter* p : params) {
    const std::vector<const on_disk::Record*>& records = c.by_param.at(p->name());
    // NOTE [master records]: an f32 model takes the precise weights.
    const std::vector<std::string>& kinds = c.params.at(p->name()).kinds;
    const bool saved_master = std::find(kinds.begin(), kinds.end(), kMaster) != kinds.end();
    const std::string kind = p->dtype() == DType::f32 && saved_master ? kMaster : "value";
    copy_into(on_disk::read_local(records, p->name(), kind, Layout{p->shape(), p->placement()}, 0,
                                  p->numel()),
              p->value());
    for (const on_disk::Record* r : records) r->release();
  }
  return c.state;
}

TrainingState load_checkpoint(const std::filesystem::path& step_dir, parallel::ZeroOptimizer& zero,
                              int dp_rank, comm::Communicator& world,
                              const std::vector<nn::Buffer>& buffers) {
  return load_agreed(world, str_cat("checkpoint ", step_dir),
                     [&] { return load_checkpoint(step_dir, zero, dp_rank, buffers); });
}

namespace {

// load_weights for the parameters `params`, kept as `zero` keeps them, or,
// without `zero`, as the parameters' own values (a model without an optimizer).
WeightsReport load_weights_into(const std::filesystem::path& file,
                                const std::vector<nn::Parameter*>& params,
                                parallel::ZeroOptimizer* zero, int dp_rank) {
  const SafetensorsIndex index = index_safetensors(file);
  const std::string where = str_cat("weights file ", file.string());
  std::map<std::string, const SafetensorsIndex::Entry*> by_name;
  for (const SafetensorsIndex::Entry& e : index.entries) {
    constexpr std::string_view kPrefix = "transformer.";
    const std::string name = e.name.starts_with(kPrefix) ? e.name.substr(kPrefix.size()) : e.name;
    const auto [it, added] = by_name.emplace(name, &e);
    LOOM_CHECK(added, where, ": tensors '", it->second->name, "' and '", e.name,
               "' would both be parameter '", name, "'");
  }
  // The whole tensors as the file holds them: the model's global shapes
  // without padding, [in, out] for the Conv1D weights of a GPT-2 file.
  std::map<std::string, Shape> model_shapes;
  for (const nn::Parameter* p : params) {
    model_shapes[p->name()] = Layout{p->shape(), p->placement()}.model_shape();
  }
  const auto swapped = [](const Shape& s) { return Shape{s[1], s[0]}; };
  WeightsReport report;
  for (const nn::Parameter* p : params) {
    const Shape& m = model_shapes[p->name()];
    const auto it = by_name.find(p->name());
    if (!is_gpt2_conv1d(p->name()) || m.size() != 2 || m[0] == m[1] || it == by_name.end()) {
      continue;
    }
    report.gpt2_layout = it->second->shape == swapped(m);
    break;
  }
  const auto stored_shape = [&](const nn::Parameter& p) {
    const Shape& m = model_shapes[p.name()];
    return report.gpt2_layout && is_gpt2_conv1d(p.name()) && m.size() == 2 ? swapped(m) : m;
  };
  // A position table with more rows than the model's: its first rows.
  const auto prefix_of = [&](const nn::Parameter& p, const Shape& stored) {
    const Shape& m = model_shapes[p.name()];
    return p.name().ends_with("wpe.weight") && m.size() == 2 && stored.size() == 2 &&
           stored[1] == m[1] && stored[0] > m[0];
  };
  // Every parameter checked before any changes.
  for (const nn::Parameter* p : params) {
    const auto it = by_name.find(p->name());
    LOOM_CHECK(it != by_name.end(), where, ": the model's parameter '", p->name(),
               "' is not in it (weights of another model?)");
    const SafetensorsIndex::Entry& e = *it->second;
    LOOM_CHECK(e.shape == stored_shape(*p) || prefix_of(*p, e.shape), where, ": tensor '", e.name,
               "' has shape ", shape_str(e.shape), " where the model's parameter '", p->name(),
               "' needs ", shape_str(stored_shape(*p)),
               report.gpt2_layout ? " (GPT-2's layout)" : "",
               ": the model's sizes (vocabulary, layers, width, sequence) must be the weights'");
    LOOM_CHECK(e.dtype == DType::f32 || e.dtype == DType::bf16 || e.dtype == DType::f16, where,
               ": tensor '", e.name, "' is ", e.dtype, ", not f32, bf16 or f16");
  }
  const int stage = zero ? zero->stage() : 0;
  const std::vector<parallel::ShardPiece> pieces =
      zero ? zero->shard_pieces(dp_rank) : std::vector<parallel::ShardPiece>{};
  const std::vector<Tensor> values = zero ? zero->value_shards() : std::vector<Tensor>{};
  for (nn::Parameter* p : params) {
    const SafetensorsIndex::Entry& e = *by_name.at(p->name());
    Tensor whole = read_safetensors_tensor(index, e.name).tensor.to(DType::f32);
    if (report.gpt2_layout) whole = gpt2_conv1d_transposed(p->name(), whole);
    if (prefix_of(*p, e.shape)) {
      const Shape& m = model_shapes[p->name()];
      whole = whole.flat_view(0, m);
      report.prefixes.push_back(
          str_cat(e.name, ": the first ", m[0], " of its ", e.shape[0], " positions"));
    }
    // The whole tensor as the one record of the parameter, its values given.
    const on_disk::Record record{.file = file.string(),
                                 .param = p->name(),
                                 .kind = "value",
                                 .begin = 0,
                                 .end = whole.numel(),
                                 .layout = {model_shapes[p->name()], nn::Placement{}},
                                 .index = &index,
                                 .tensor = e.name,
                                 .cached = whole};
    const std::vector<const on_disk::Record*> records{&record};
    const Layout mine{p->shape(), p->placement()};
    const auto read = [&](int64_t begin, int64_t end) {
      return on_disk::read_local(records, p->name(), "value", mine, begin, end);
    };
    if (stage != 3) copy_into(read(0, p->numel()), p->value());
    for (size_t i = 0; i < pieces.size(); ++i) {
      if (pieces[i].param != p) continue;
      const int64_t begin = pieces[i].begin, end = pieces[i].end;
      if (stage == 3) copy_into(read(begin, end), values[i]);
      optim::Optimizer& opt = zero->optimizer();
      if (stage > 0 && keeps_master(opt.slots()[i], *p)) {
        copy_into(read(begin, end), opt.slots()[i].current_value());
      }
    }
    ++report.tensors;
  }
  for (const auto& [name, e] : by_name) {
    if (model_shapes.count(name) == 0) report.skipped.push_back(e->name);
  }
  return report;
}

}  // namespace

WeightsReport load_weights(const std::filesystem::path& file, parallel::ZeroOptimizer& zero,
                           int dp_rank) {
  return load_weights_into(file, zero.parameters(), &zero, dp_rank);
}

WeightsReport load_weights(const std::filesystem::path& file, nn::Module& model) {
  return load_weights_into(file, model.parameters(), nullptr, 0);
}

WeightsReport load_weights(const std::filesystem::path& file, parallel::ZeroOptimizer& zero,
                           int dp_rank, comm::Communicator& world) {
  return load_agreed(world, str_cat("weights file ", file.string()),
                     [&] { return load_weights(file, zero, dp_rank); });
}

}  // namespace loom::checkpoint
