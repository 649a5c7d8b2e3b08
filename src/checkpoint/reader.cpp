// Reading a distributed checkpoint (CheckpointReader, latest_checkpoint): the
// manifest, the header of every file it lists and their records, checked
// before anything is used; the data on demand (NOTE [records read on demand]
// in records.hpp). Depends on core/ and the safetensors reader only (checkpoint/records.hpp).
#include <algorithm>
#include <fstream>

#include "checkpoint/records.hpp"
#include "loom/checkpoint/distributed.hpp"
#include "loom/checkpoint/safetensors.hpp"
#include "loom/core/error.hpp"

namespace loom::checkpoint {

using json = nlohmann::json;

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
  const std::string in_manifest = str_cat("checkpoint manifest ", manifest_path);
  try {
    const int64_t format =
        manifest.contains("format") ? on_disk::integer(manifest, in_manifest, "format") : 0;
    LOOM_CHECK(format == on_disk::kFormat, in_manifest, ": format ", format, " is not ",
               on_disk::kFormat);
    c.state.step = on_disk::integer(manifest, in_manifest, "step");
    c.state.info = manifest.at("info").get<std::map<std::string, std::string>>();
    const int64_t world = on_disk::integer(manifest, in_manifest, "world");
    c.names = manifest.at("files").get<std::vector<std::string>>();
    LOOM_CHECK(static_cast<int64_t>(c.names.size()) == world, in_manifest, " lists ",
               c.names.size(), " files for a world of ", world, " ranks");
    c.world = static_cast<int>(world);
    for (const std::string& name : c.names) {
      LOOM_CHECK(!name.empty() && name != "." && name != ".." && name.find('/') == name.npos,
                 in_manifest, " lists file '", name,
                 "': a checkpoint's files are plain names in its directory");
      const std::filesystem::path path = step_dir / name;
      LOOM_CHECK(std::filesystem::exists(path), "checkpoint ", step_dir, ": file ", name,
                 " listed in its manifest is missing");
      c.files.push_back(index_safetensors(path));  // NOTE [records read on demand]
    }
    for (size_t f = 0; f < c.files.size(); ++f) {
      const std::string& file = c.names[f];
      const std::string in_file = str_cat("checkpoint file ", file);
      const auto it = c.files[f].metadata.find(on_disk::kMetadataKey);
      LOOM_CHECK(it != c.files[f].metadata.end(), in_file, " has no Loom checkpoint metadata");
      const json meta = json::parse(it->second);
      const int64_t step = on_disk::integer(meta, in_file, "step");
      LOOM_CHECK(step == c.state.step, in_file, " is of step ", step, ", the manifest of step ",
                 c.state.step);
      c.optimizer_steps = on_disk::integer(meta, in_file, "optimizer_steps");
      for (const json& r : meta.at("records")) {
        on_disk::Record rec{file,
                            r.at("param").get<std::string>(),
                            r.at("kind").get<std::string>(),
                            on_disk::integer(r, in_file, "begin"),
                            on_disk::integer(r, in_file, "end"),
                            on_disk::layout_from(r.at("layout"), in_file),
                            &c.files[f],
                            r.at("tensor").get<std::string>()};
        const SafetensorsIndex::Entry& stored = c.files[f].at(rec.tensor);
        const Shape global = rec.layout.global_shape();
        LOOM_CHECK(rec.begin >= 0 && rec.begin <= rec.end &&
                       rec.end <= shape_numel(rec.layout.local_shape) &&
                       shape_numel(stored.shape) == rec.end - rec.begin &&
                       stored.dtype == DType::f32 && global.size() == rec.layout.local_shape.size(),
                   "checkpoint file ", file, ": record '", r.at("tensor").get<std::string>(),
                   "' does not fit its parameter's shape");
        c.records.push_back(std::move(rec));
      }
    }
  } catch (const json::exception& e) {
    throw Error(str_cat("checkpoint ", step_dir, ": malformed metadata: ", e.what()));
  }
  for (const on_disk::Record& r : c.records) {
    c.by_param[r.param].push_back(&r);
    ParamInfo& info = c.params[r.param];
    if (info.records == 0) info.global_shape = r.layout.model_shape();
    LOOM_CHECK(info.global_shape == r.layout.model_shape(), "checkpoint file ", r.file,
               ": parameter '", r.param, "' has global shape ", shape_str(r.layout.model_shape()),
               " here and ", shape_str(info.global_shape), " in another record");
    if (std::find(info.kinds.begin(), info.kinds.end(), r.kind) == info.kinds.end()) {
      info.kinds.push_back(r.kind);
    }
    ++info.records;
    info.bytes += (r.end - r.begin) * static_cast<int64_t>(sizeof(float));
  }
  // Every rank refuses an incomplete checkpoint before it loads anything.
  for (const auto& [param, info] : c.params) {
    for (const std::string& kind : info.kinds) {
      on_disk::check_complete(c.by_param.at(param), param, kind, info.global_shape);
    }
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
  return Tensor::from_vector(on_disk::assemble(impl_->by_param.at(param), param, kind, shape),
                             shape);
}

}  // namespace loom::checkpoint
