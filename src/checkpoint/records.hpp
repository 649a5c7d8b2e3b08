// Internal: the records of a distributed checkpoint (checkpoint/distributed.hpp)
// and the reader's state, shared by the writer and loader (distributed.cpp)
// and the reading path (records.cpp, reader.cpp).
//
// The reading path depends on core/ and the safetensors reader only, not on
// comm/, optim/ or parallel/: tests/checkpoint/fuzz_reader_main.cpp builds it
// on its own under ASan and UBSan (docs/checkpoint.md, "Proven": checkpoint.reader_fuzz_asan).
//
// NOTE [records read on demand]
// Opening a checkpoint reads the manifest and every file's header (the
// records, their layouts, checksums and offsets), never the data: a rank
// that loads reads only the records that hold elements it keeps
// (read_local), so with N ranks each reads about 1/N of a sharded
// checkpoint, and never materialises a whole tensor. What every rank still
// checks before loading anything: the manifest, every header (a truncated
// file fails there: its tensors no longer cover its data section), each
// record's fit, and that each parameter's records cover its global tensor
// (check_complete). A flipped bit in data is found by the ranks that read
// it (the checksum of each record they read); train_gpt makes the others
// stop with it (load_checkpoint's agreement, checkpoint/distributed.hpp).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "loom/checkpoint/distributed.hpp"
#include "loom/checkpoint/safetensors.hpp"
#include "loom/core/tensor.hpp"
#include "loom/nn/parameter.hpp"

namespace loom::checkpoint::on_disk {

constexpr const char* kMetadataKey = "checkpoint";  // in each file's __metadata__
constexpr int kFormat = 1;

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

// The integer j[key]; throws loom::Error naming `where` and the key when it
// is a float, a string or outside int64's range (nlohmann's get<int64_t>()
// would cast a float: undefined for 1e300), nlohmann::json::exception when
// it is missing.
int64_t integer(const nlohmann::json& j, const std::string& where, const char* key);

// The index in the unpadded global tensor of padded global index `g`, or -1
// for a padding element (padding is along the shard dimension).
int64_t unpadded(const Layout& l, int64_t g);

nlohmann::json layout_json(const Layout& l);
// Reads a layout that layout_json wrote. Throws nlohmann::json::exception
// for a missing field and loom::Error, naming `where` and the rule, for a
// value no parameter can have: for_each_run and unpadded stay inside the
// local and the global tensor of every layout it returns.
Layout layout_from(const nlohmann::json& j, const std::string& where);

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

// The record of a file: which parameter, which kind ("value" or a state
// name), which local elements, laid out how, and which tensor of the file
// holds them (f32, end - begin elements; checked against the header).
struct Record {
  std::string file;
  std::string param, kind;
  int64_t begin = 0, end = 0;
  Layout layout;
  const SafetensorsIndex* index = nullptr;
  std::string tensor;
  // NOTE [records read on demand]: the values, read from the file (and their
  // checksum checked) at the first values() call, kept until release().
  mutable Tensor cached{};
  const Tensor& values() const;
  void release() const { cached = Tensor(); }
};

// Throws naming the element when the records of a parameter's kind leave a
// hole in its global tensor (an incomplete checkpoint). Reads no data: the
// layouts say which elements each record holds.
void check_complete(const std::vector<const Record*>& records, const std::string& param,
                    const std::string& kind, const Shape& global_shape);

// A parameter's global tensor of one kind, assembled from its records;
// throws naming the element when the records leave a hole.
std::vector<float> assemble(const std::vector<const Record*>& records, const std::string& param,
                            const std::string& kind, const Shape& global_shape);

// Local elements [begin, end) of a parameter laid out as `mine`, of one kind,
// from the records that hold some of them; the others are not read. Padding
// elements of `mine` are zero. Throws naming the element when no record holds
// one, and naming the file when a record's global shape is not the model's.
std::vector<float> read_local(const std::vector<const Record*>& records, const std::string& param,
                              const std::string& kind, const Layout& mine, int64_t begin,
                              int64_t end);

}  // namespace loom::checkpoint::on_disk

namespace loom::checkpoint {

struct CheckpointReader::Impl {
  std::filesystem::path dir;
  TrainingState state;
  int world = 0;
  int64_t optimizer_steps = -1;
  std::vector<std::string> names;
  std::vector<SafetensorsIndex> files;  // headers only (NOTE [records read on demand])
  std::vector<on_disk::Record> records;
  std::map<std::string, std::vector<const on_disk::Record*>> by_param;
  std::map<std::string, ParamInfo> params;
};

}  // namespace loom::checkpoint
