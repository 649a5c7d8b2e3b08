// Safetensors files: how Loom stores tensors on disk (checkpoint shards).
//
// The format is Hugging Face's safetensors, so any safetensors reader opens a
// file Loom wrote and Loom opens files others wrote:
//
//   8 bytes    little-endian u64 N, the header's length
//   N bytes    a JSON object: for each tensor {"dtype", "shape", "data_offsets":
//              [begin, end)} (offsets into the data section), plus an optional
//              "__metadata__" object of string to string; padded with spaces so
//              that the data starts 8-byte aligned
//   the data   every tensor's bytes, little-endian, row-major, back to back
//
// Loom adds, inside "__metadata__", the key "loom.tensors": a JSON string that
// gives for each tensor a CRC-32C checksum of its bytes and, for a shard of a
// larger tensor, the global shape and the shard's offset in each dimension.
// That is what lets a checkpoint saved under one parallel layout be read back
// under another. Keys starting with "loom." are reserved.
//
// Guarantees:
//  - save_safetensors() writes atomically and durably: the file at `path` is
//    the previous one or the complete new one, never a prefix, whatever
//    happens during the write (temporary file, fsync, rename).
//  - load_safetensors() checks the whole header before reading data (sizes,
//    offsets inside the file, no overlaps or holes, known dtypes, shapes that
//    match the byte counts, shards that fit their global shape) and every
//    checksum Loom stored; a violation throws loom::Error naming the file, the
//    tensor and the rule.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loom/core/tensor.hpp"

namespace loom::checkpoint {

// Where a stored tensor sits inside the global tensor it is a shard of.
struct ShardPlacement {
  Shape global_shape;            // the whole tensor
  std::vector<int64_t> offsets;  // the shard's first index in each dimension
};

struct StoredTensor {
  std::string name;
  Tensor tensor;                        // any device when saving; host when loaded
  std::optional<ShardPlacement> shard;  // absent: the tensor is whole
};

struct SafetensorsFile {
  std::vector<StoredTensor> tensors;            // in the order of their data in the file
  std::map<std::string, std::string> metadata;  // "__metadata__" without Loom's own keys

  // The tensor called `name`; throws naming the file's tensors when absent.
  const StoredTensor& at(const std::string& name) const;
};

// Writes `tensors` (unique, non-empty names; f32, bf16, f16, i32 or i64) and
// `metadata` to `path`, atomically. Tensors on a device are copied to the host.
void save_safetensors(const std::filesystem::path& path, const std::vector<StoredTensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Reads and checks a whole file (see the guarantees above).
SafetensorsFile load_safetensors(const std::filesystem::path& path);

// A file's header, checked as load_safetensors() checks it, and where each
// tensor's bytes lie; the data is read on demand (read_safetensors_tensor), so
// a program reads only the tensors it needs (a rank loading its shards of a
// checkpoint).
struct SafetensorsIndex {
  struct Entry {
    std::string name;
    DType dtype = DType::f32;
    Shape shape;
    uint64_t offset = 0, bytes = 0;  // in the file
    std::optional<uint32_t> crc;     // Loom's checksum, when the file has one
    std::optional<ShardPlacement> shard;
  };
  std::filesystem::path path;
  uint64_t file_bytes = 0;                      // the file's size when indexed
  std::vector<Entry> entries;                   // in the order of their data in the file
  std::map<std::string, std::string> metadata;  // "__metadata__" without Loom's own keys

  // The entry called `name`; throws naming the file's tensors when absent.
  const Entry& at(const std::string& name) const;
};

SafetensorsIndex index_safetensors(const std::filesystem::path& path);
// Reads the tensor called `name` from an indexed file and checks its checksum;
// throws loom::Error naming the file and the tensor (a checksum that fails, a
// file that changed size since it was indexed).
StoredTensor read_safetensors_tensor(const SafetensorsIndex& index, const std::string& name);

// The CRC-32C (Castagnoli) of `bytes`, as stored in "loom.tensors".
uint32_t crc32c(const void* data, size_t bytes, uint32_t crc = 0);

}  // namespace loom::checkpoint
