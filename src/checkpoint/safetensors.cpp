#include "loom/checkpoint/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "core/atomic_file.hpp"
#include "loom/core/error.hpp"

namespace loom::checkpoint {
namespace {

using json = nlohmann::json;

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this host is not");

constexpr const char* kMetadataKey = "__metadata__";
constexpr const char* kLoomTensorsKey = "loom.tensors";
// safetensors readers refuse headers above 100 MB; so does Loom.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeCode {
  DType dtype;
  const char* code;
};
constexpr DTypeCode kCodes[] = {{DType::f32, "F32"},
                                {DType::bf16, "BF16"},
                                {DType::f16, "F16"},
                                {DType::i32, "I32"},
                                {DType::i64, "I64"}};

const char* code_of(DType dtype) {
  for (const DTypeCode& c : kCodes) {
    if (c.dtype == dtype) return c.code;
  }
  LOOM_ASSERT(false, "dtype ", dtype, " has no safetensors code");
  return "";
}

std::string hex32(uint32_t value) {
  char text[9];
  std::snprintf(text, sizeof(text), "%08x", value);
  return text;
}

void check_placement(const std::string& where, const Shape& shape, const ShardPlacement& shard) {
  LOOM_CHECK(shard.global_shape.size() == shape.size() && shard.offsets.size() == shape.size(),
             where, ": shard of shape ", shape_str(shape), " has global shape ",
             shape_str(shard.global_shape), " and offsets ", shape_str(shard.offsets),
             ": all three need one entry per dimension");
  for (size_t d = 0; d < shape.size(); ++d) {
    // Not offsets + shape <= global: a hostile offset would overflow.
    LOOM_CHECK(shard.offsets[d] >= 0 && shape[d] <= shard.global_shape[d] &&
                   shard.offsets[d] <= shard.global_shape[d] - shape[d],
               where, ": shard of shape ", shape_str(shape), " at offsets ",
               shape_str(shard.offsets), " does not fit in the global shape ",
               shape_str(shard.global_shape), " (dimension ", d, ")");
  }
}

// ---- reading ----------------------------------------------------------------------------------

// Throws loom::Error naming the file: "safetensors file 'p': <rule>".
class Reader {
 public:
  explicit Reader(const std::filesystem::path& path) : path_(path.string()) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail("cannot open it: ", std::strerror(errno));
    struct stat info {};
    if (::fstat(fd_, &info) != 0) fail("cannot stat it: ", std::strerror(errno));
    size_ = static_cast<uint64_t>(info.st_size);
  }
  ~Reader() { ::close(fd_); }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    throw Error(str_cat("safetensors file '", path_, "': ", args...));
  }

  uint64_t size() const { return size_; }

  void read_at(uint64_t offset, void* out, uint64_t bytes, const std::string& what) const {
    auto* p = static_cast<char*>(out);
    while (bytes > 0) {
      const ssize_t n = ::pread(fd_, p, bytes, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        fail("reading ", what,
             " failed: ", n == 0 ? "unexpected end of file" : std::strerror(errno));
      }
      p += n;
      offset += static_cast<uint64_t>(n);
      bytes -= static_cast<uint64_t>(n);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// A header entry; begin and end are offsets into the data section.
struct Entry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;
  std::optional<uint32_t> crc;
  std::optional<ShardPlacement> shard;
};

int64_t non_negative(const Reader& file, const json& value, const std::string& what) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0) {
    file.fail(what, " is ", value.dump(), ", not a non-negative integer");
  }
  return value.get<int64_t>();
}

Shape shape_from(const Reader& file, const json& value, const std::string& what) {
  if (!value.is_array()) file.fail(what, " is ", value.dump(), ", not an array");
  Shape shape;
  for (const json& d : value) shape.push_back(non_negative(file, d, what + " entry"));
  return shape;
}

Entry parse_entry(const Reader& file, const std::string& name, const json& value) {
  const std::string where = "tensor '" + name + "'";
  if (!value.is_object()) file.fail(where, " is described by ", value.dump(), ", not an object");
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(key)) file.fail(where, " has no \"", key, "\"");
  }
  Entry e;
  e.name = name;
  const json& code = value["dtype"];
  const auto known = std::find_if(std::begin(kCodes), std::end(kCodes), [&](const DTypeCode& c) {
    return code.is_string() && code.get<std::string>() == c.code;
  });
  if (known == std::end(kCodes)) {
    file.fail(where, " has dtype ", code.dump(), ", which Loom does not hold (F32, BF16, F16, ",
              "I32, I64)");
  }
  e.dtype = known->dtype;
  e.shape = shape_from(file, value["shape"], where + " shape");
  const json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    file.fail(where, " has data_offsets ", offsets.dump(), ", not [begin, end]");
  }
  e.begin = static_cast<uint64_t>(non_negative(file, offsets[0], where + " data_offsets"));
  e.end = static_cast<uint64_t>(non_negative(file, offsets[1], where + " data_offsets"));
  if (e.end < e.begin)
    file.fail(where, " has data_offsets [", e.begin, ", ", e.end, "): end < begin");
  // Bytes the shape needs, without overflowing on a hostile shape.
  uint64_t bytes = dtype_size(e.dtype);
  for (const int64_t d : e.shape) {
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes) || bytes > file.size()) {
      file.fail(where, " of shape ", shape_str(e.shape), " needs more bytes than the file has (",
                file.size(), ")");
    }
  }
  if (bytes != e.end - e.begin) {
    file.fail(where, " of shape ", shape_str(e.shape), " and dtype ", code_of(e.dtype), " needs ",
              bytes, " bytes, but its data_offsets [", e.begin, ", ", e.end, ") hold ",
              e.end - e.begin);
  }
  return e;
}

// A checksum as hex32() writes it: eight hexadecimal digits.
uint32_t parse_hex32(const Reader& file, const std::string& where, const std::string& text) {
  uint32_t value = 0;
  const bool hex = text.size() == 8 && std::all_of(text.begin(), text.end(), [](char c) {
                     return std::isxdigit(static_cast<unsigned char>(c)) != 0;
                   });
  if (!hex) file.fail(where, " has crc32c \"", text, "\", not eight hexadecimal digits");
  std::from_chars(text.data(), text.data() + text.size(), value, 16);
  return value;
}

// Loom's per-tensor records in "loom.tensors": checksum and shard placement.
void parse_loom_records(const Reader& file, const std::string& text, std::vector<Entry>& entries) {
  json records;
  try {
    records = json::parse(text);
  } catch (const json::parse_error& e) {
    file.fail("metadata \"", kLoomTensorsKey, "\" is not valid JSON: ", e.what());
  }
  if (!records.is_object()) file.fail("metadata \"", kLoomTensorsKey, "\" is not a JSON object");
  for (Entry& e : entries) {
    const std::string where = "tensor '" + e.name + "'";
    if (!records.contains(e.name)) file.fail(where, " has no record in \"", kLoomTensorsKey, "\"");
    const json& r = records[e.name];
    if (!r.is_object() || !r.contains("crc32c") || !r["crc32c"].is_string()) {
      file.fail(where, ": its record in \"", kLoomTensorsKey, "\" has no crc32c string");
    }
    e.crc = parse_hex32(file, where, r["crc32c"].get<std::string>());
    if (r.contains("global_shape") || r.contains("offsets")) {
      ShardPlacement shard{
          shape_from(file, r.value("global_shape", json()), where + " global_shape"),
          shape_from(file, r.value("offsets", json()), where + " offsets")};
      try {
        check_placement("safetensors file " + where, e.shape, shard);
      } catch (const Error& error) {
        file.fail(error.what());
      }
      e.shard = std::move(shard);
    }
  }
  if (records.size() != entries.size()) {
    file.fail("\"", kLoomTensorsKey, "\" describes ", records.size(), " tensors, the header ",
              entries.size());
  }
}

}  // namespace

// ---- public -----------------------------------------------------------------------------------

const StoredTensor& SafetensorsFile::at(const std::string& name) const {
  for (const StoredTensor& t : tensors) {
    if (t.name == name) return t;
  }
  std::string names;
  for (const StoredTensor& t : tensors) names += (names.empty() ? "" : ", ") + t.name;
  throw Error(str_cat("no tensor '", name, "' in this safetensors file (it holds: ", names, ")"));
}

void save_safetensors(const std::filesystem::path& path, const std::vector<StoredTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string where = "saving safetensors file '" + path.string() + "'";
  for (const auto& [key, value] : metadata) {
    LOOM_CHECK(key.rfind("loom.", 0) != 0, where, ": metadata key '", key,
               "' starts with 'loom.', which Loom reserves for itself");
  }
  std::set<std::string> names;
  std::vector<Tensor> host;
  json header = json::object();
  json records = json::object();
  uint64_t offset = 0;
  for (const StoredTensor& t : tensors) {
    LOOM_CHECK(!t.name.empty() && t.name != kMetadataKey, where, ": tensor name '", t.name,
               "' is empty or reserved");
    LOOM_CHECK(names.insert(t.name).second, where, ": two tensors are called '", t.name, "'");
    LOOM_CHECK(t.tensor.defined(), where, ": tensor '", t.name, "' is undefined");
    if (t.shard) check_placement(where + ", tensor '" + t.name + "'", t.tensor.shape(), *t.shard);
    host.push_back(t.tensor.device().is_cpu() ? t.tensor : t.tensor.to(Device::cpu()));
    const Tensor& h = host.back();
    header[t.name] = {{"dtype", code_of(h.dtype())},
                      {"shape", h.shape()},
                      {"data_offsets", {offset, offset + h.nbytes()}}};
    json record = {{"crc32c", hex32(crc32c(h.data(), h.nbytes()))}};
    if (t.shard) {
      record["global_shape"] = t.shard->global_shape;
      record["offsets"] = t.shard->offsets;
    }
    records[t.name] = std::move(record);
    offset += h.nbytes();
  }
  json meta(metadata);
  meta[kLoomTensorsKey] = records.dump();
  header[kMetadataKey] = std::move(meta);
  std::string text = header.dump();
  // Pad with spaces (the format allows trailing whitespace) so that the data
  // starts 8-byte aligned, as the safetensors package's own writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t length = text.size();
  detail::write_file_atomically(path, "safetensors file", [&](detail::FileSink& sink) {
    sink.write(&length, sizeof(length));
    sink.write(text);
    for (const Tensor& h : host) sink.write(h.data(), h.nbytes());
  });
}

SafetensorsIndex index_safetensors(const std::filesystem::path& path) {
  const Reader file(path);
  if (file.size() < 8) {
    file.fail("it is ", file.size(), " bytes long, shorter than the 8-byte header length");
  }
  uint64_t length = 0;
  file.read_at(0, &length, 8, "the header length");
  if (length > file.size() - 8 || length > kMaxHeaderBytes) {
    file.fail("its header length ", length, " exceeds ",
              length > kMaxHeaderBytes ? "the 100 MB limit" : "the file");
  }
  std::string text(length, '\0');
  file.read_at(8, text.data(), length, "the header");
  json header;
  try {
    header = json::parse(text);
  } catch (const json::parse_error& e) {
    file.fail("its header is not valid JSON: ", e.what());
  }
  if (!header.is_object()) file.fail("its header is not a JSON object");

  SafetensorsIndex result;
  result.path = path;
  result.file_bytes = file.size();
  std::vector<Entry> entries;
  std::optional<std::string> loom_records;
  for (const auto& [key, value] : header.items()) {
    if (key != kMetadataKey) {
      entries.push_back(parse_entry(file, key, value));
      continue;
    }
    if (!value.is_object()) file.fail("\"", kMetadataKey, "\" is not an object");
    for (const auto& [mkey, mvalue] : value.items()) {
      if (!mvalue.is_string()) file.fail("metadata \"", mkey, "\" is not a string");
      if (mkey == kLoomTensorsKey) {
        loom_records = mvalue.get<std::string>();
      } else {
        result.metadata[mkey] = mvalue.get<std::string>();
      }
    }
  }
  // The data section must be covered exactly: no overlaps, no holes, nothing after.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
  });
  const uint64_t data_start = 8 + length, data_bytes = file.size() - data_start;
  uint64_t covered = 0;
  for (const Entry& e : entries) {
    if (e.begin != covered) {
      file.fail("tensor '", e.name, "' starts at data byte ", e.begin, " where ", covered,
                e.begin < covered ? " was expected: it overlaps the tensor before it"
                                  : " was expected: the bytes between belong to no tensor");
    }
    covered = e.end;
  }
  if (covered != data_bytes) {
    file.fail("its tensors cover ", covered, " data bytes, but the file holds ", data_bytes,
              covered < data_bytes ? " (bytes after the last tensor)" : " (truncated)");
  }
  if (loom_records) parse_loom_records(file, *loom_records, entries);
  for (Entry& e : entries) {
    result.entries.push_back({e.name, e.dtype, std::move(e.shape), data_start + e.begin,
                              e.end - e.begin, e.crc, std::move(e.shard)});
  }
  return result;
}

const SafetensorsIndex::Entry& SafetensorsIndex::at(const std::string& name) const {
  for (const Entry& e : entries) {
    if (e.name == name) return e;
  }
  std::string names;
  for (const Entry& e : entries) names += (names.empty() ? "" : ", ") + e.name;
  throw Error(str_cat("safetensors file '", path.string(), "': no tensor '", name,
                      "' (it holds: ", names, ")"));
}

namespace {

StoredTensor read_entry(const Reader& file, const SafetensorsIndex::Entry& e) {
  Tensor t = Tensor::empty(e.shape, e.dtype);
  file.read_at(e.offset, t.data(), e.bytes, "tensor '" + e.name + "'");
  if (e.crc && crc32c(t.data(), t.nbytes()) != *e.crc) {
    file.fail("tensor '", e.name, "' fails its checksum (crc32c ",
              hex32(crc32c(t.data(), t.nbytes())), ", stored ", hex32(*e.crc),
              "): the file is corrupt");
  }
  return {e.name, std::move(t), e.shard};
}

}  // namespace

StoredTensor read_safetensors_tensor(const SafetensorsIndex& index, const std::string& name) {
  const SafetensorsIndex::Entry& e = index.at(name);
  const Reader file(index.path);
  if (file.size() != index.file_bytes) {
    file.fail("it is ", file.size(), " bytes long, ", index.file_bytes,
              " when its header was read: it changed while being read");
  }
  return read_entry(file, e);
}

SafetensorsFile load_safetensors(const std::filesystem::path& path) {
  const SafetensorsIndex index = index_safetensors(path);
  const Reader file(path);
  if (file.size() != index.file_bytes) {
    file.fail("it is ", file.size(), " bytes long, ", index.file_bytes,
              " when its header was read: it changed while being read");
  }
  SafetensorsFile result;
  result.metadata = index.metadata;
  for (const SafetensorsIndex::Entry& e : index.entries)
    result.tensors.push_back(read_entry(file, e));
  return result;
}

}  // namespace loom::checkpoint
