// Safetensors files (include/loom/checkpoint/safetensors.hpp): round trips of
// every dtype bit for bit, the on-disk layout, every corruption rejected with a
// message naming the rule, and writes that leave the old file whole when they
// fail half-way. (tests/checkpoint/safetensors_interop.py checks the files
// against the safetensors package itself.)
#include <signal.h>
#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../data/temp_dir.hpp"
#include "loom/checkpoint/safetensors.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Shape;
using loom::Tensor;
using loom::checkpoint::crc32c;
using loom::checkpoint::load_safetensors;
using loom::checkpoint::save_safetensors;
using loom::checkpoint::ShardPlacement;
using loom::checkpoint::StoredTensor;
namespace fs = std::filesystem;

namespace {

// A tensor whose bytes are a fixed pattern (every bit pattern, NaNs included,
// must survive the round trip).
Tensor patterned(const Shape& shape, DType dtype, uint8_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* bytes = static_cast<uint8_t*>(t.data());
  for (size_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<uint8_t>(seed + 31 * i + i / 7);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::vector<StoredTensor> sample() {
  return {
      {"wte", patterned({5, 3}, DType::f32, 1), std::nullopt},
      {"h.0.ln.w", patterned({3}, DType::bf16, 2), ShardPlacement{{6}, {3}}},
      {"half", patterned({2, 2, 2}, DType::f16, 3), std::nullopt},
      {"step", patterned({1}, DType::i64, 4), std::nullopt},
      {"ids", patterned({1, 4}, DType::i32, 5), ShardPlacement{{4, 8}, {2, 4}}},
      {"empty", Tensor::empty({0, 3}, DType::f32), std::nullopt},
  };
}

// The header of a file written by Loom, and where its data starts.
nlohmann::json header_of(const std::string& bytes, uint64_t* data_start = nullptr) {
  uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  if (data_start) *data_start = 8 + length;
  return nlohmann::json::parse(bytes.substr(8, length));
}

// `bytes` with its header replaced by `header` (data unchanged).
std::string with_header(const std::string& bytes, const nlohmann::json& header) {
  uint64_t start = 0;
  header_of(bytes, &start);
  std::string text = header.dump();
  const uint64_t length = text.size();
  std::string out(reinterpret_cast<const char*>(&length), 8);
  return out + text + bytes.substr(start);
}

}  // namespace

TEST_CASE("crc32c matches the published check value", "[checkpoint]") {
  CHECK(crc32c("123456789", 9) == 0xE3069283u);  // RFC 3720, the CRC-32C check value
  CHECK(crc32c("", 0) == 0u);
  // Incremental use equals one pass; the hardware and the table path agree on
  // every tail length (1..7 bytes after the 8-byte words).
  std::string text(37, '\0');
  for (size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>(i * 13 + 5);
  CHECK(crc32c(text.data() + 20, 17, crc32c(text.data(), 20)) == crc32c(text.data(), 37));
}

TEST_CASE("safetensors: every dtype, shards and metadata round-trip bit for bit", "[checkpoint]") {
  loom::test::TempDir dir;
  const fs::path path = dir.path() / "shard.safetensors";
  const std::vector<StoredTensor> saved = sample();
  save_safetensors(path, saved, {{"step", "42"}, {"layout", "dp2"}});

  const loom::checkpoint::SafetensorsFile file = load_safetensors(path);
  REQUIRE(file.tensors.size() == saved.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    INFO("tensor " << saved[i].name);
    const StoredTensor& got = file.tensors[i];  // file order = the order saved
    CHECK(got.name == saved[i].name);
    CHECK(same_bytes(got.tensor, saved[i].tensor));
    CHECK(got.tensor.device().is_cpu());
    REQUIRE(got.shard.has_value() == saved[i].shard.has_value());
    if (got.shard) {
      CHECK(got.shard->global_shape == saved[i].shard->global_shape);
      CHECK(got.shard->offsets == saved[i].shard->offsets);
    }
  }
  CHECK(file.metadata == std::map<std::string, std::string>{{"step", "42"}, {"layout", "dp2"}});
  CHECK(same_bytes(file.at("ids").tensor, saved[4].tensor));
  CHECK_THROWS_WITH(file.at("nope"), Contains("no tensor 'nope'") && Contains("wte, h.0.ln.w"));
}

TEST_CASE("safetensors: the layout is the format's (header length, aligned data, offsets)",
          "[checkpoint]") {
  loom::test::TempDir dir;
  const fs::path path = dir.path() / "a.safetensors";
  save_safetensors(path, sample());
  const std::string bytes = read_file(path);
  uint64_t start = 0;
  const nlohmann::json header = header_of(bytes, &start);
  CHECK(start % 8 == 0);
  uint64_t expected_begin = 0;
  for (const StoredTensor& t : sample()) {
    INFO("tensor " << t.name);
    const auto& entry = header.at(t.name);
    CHECK(entry.at("shape").get<Shape>() == t.tensor.shape());
    CHECK(entry.at("data_offsets")[0].get<uint64_t>() == expected_begin);
    expected_begin += t.tensor.nbytes();
    CHECK(entry.at("data_offsets")[1].get<uint64_t>() == expected_begin);
    CHECK((t.tensor.nbytes() == 0 ||
           std::memcmp(bytes.data() + start + entry.at("data_offsets")[0].get<uint64_t>(),
                       t.tensor.data(), t.tensor.nbytes()) == 0));
  }
  CHECK(bytes.size() == start + expected_begin);
  CHECK(header.at("wte").at("dtype") == "F32");
  CHECK(header.at("h.0.ln.w").at("dtype") == "BF16");
  CHECK(header.at("half").at("dtype") == "F16");
  CHECK(header.at("ids").at("dtype") == "I32");
  CHECK(header.at("step").at("dtype") == "I64");
  const auto records =
      nlohmann::json::parse(header.at("__metadata__").at("loom.tensors").get<std::string>());
  CHECK(records.at("ids").at("global_shape") == nlohmann::json({4, 8}));
  CHECK(records.at("ids").at("offsets") == nlohmann::json({2, 4}));
  CHECK(records.at("wte").contains("crc32c"));
  CHECK_FALSE(records.at("wte").contains("global_shape"));
}

TEST_CASE("safetensors: bad tensors to save are refused before any file is written",
          "[checkpoint]") {
  loom::test::TempDir dir;
  const fs::path path = dir.path() / "x.safetensors";
  const Tensor t = patterned({2}, DType::f32, 0);
  CHECK_THROWS_WITH(save_safetensors(path, {{"a", t, {}}, {"a", t, {}}}),
                    Contains("two tensors are called 'a'"));
  CHECK_THROWS_WITH(save_safetensors(path, {{"", t, {}}}), Contains("empty or reserved"));
  CHECK_THROWS_WITH(save_safetensors(path, {{"__metadata__", t, {}}}),
                    Contains("empty or reserved"));
  CHECK_THROWS_WITH(save_safetensors(path, {{"a", t, ShardPlacement{{3}, {2}}}}),
                    Contains("does not fit in the global shape [3]"));
  CHECK_THROWS_WITH(save_safetensors(path, {{"a", t, ShardPlacement{{3, 2}, {0}}}}),
                    Contains("one entry per dimension"));
  CHECK_THROWS_WITH(save_safetensors(path, {{"a", t, {}}}, {{"loom.x", "1"}}),
                    Contains("'loom.x' starts with 'loom.'"));
  CHECK(fs::is_empty(dir.path()));
}

TEST_CASE("safetensors: a write that fails half-way leaves the previous file whole",
          "[checkpoint]") {
  loom::test::TempDir dir;
  const fs::path path = dir.path() / "model.safetensors";
  save_safetensors(path, {{"w", patterned({8}, DType::f32, 9), {}}});
  const std::string before = read_file(path);

  // A file-size limit makes write() fail (EFBIG) part of the way through the
  // new, larger file: the state a crash or a full disk leaves.
  struct rlimit old_limit {};
  REQUIRE(getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
  const auto old_handler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old_limit;
  small.rlim_cur = 4096;
  REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string error;
  try {
    save_safetensors(path, {{"w", patterned({16384}, DType::f32, 7), {}}});
  } catch (const loom::Error& e) {
    error = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old_limit);
  signal(SIGXFSZ, old_handler);

  CHECK_THAT(error, Contains("model.safetensors") && Contains("failed"));
  CHECK(read_file(path) == before);  // the old file, byte for byte
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    left.push_back(entry.path().filename().string());
  }
  CHECK(left == std::vector<std::string>{"model.safetensors"});  // no temporary file left
}

TEST_CASE("safetensors: corrupt or foreign files are rejected naming the rule", "[checkpoint]") {
  loom::test::TempDir dir;
  const fs::path good = dir.path() / "good.safetensors";
  save_safetensors(good, sample());
  const std::string bytes = read_file(good);
  uint64_t start = 0;
  const nlohmann::json header = header_of(bytes, &start);
  const fs::path bad = dir.path() / "bad.safetensors";
  const auto rejects = [&](const std::string& content, const std::string& rule) {
    write_file(bad, content);
    CHECK_THROWS_WITH(load_safetensors(bad), Contains("safetensors file '") && Contains(rule));
  };

  CHECK_THROWS_WITH(load_safetensors(dir.path() / "missing.safetensors"),
                    Contains("missing.safetensors") && Contains("cannot open it"));
  rejects("1234", "shorter than the 8-byte header length");
  {
    std::string huge = bytes;
    const uint64_t length = bytes.size();
    std::memcpy(huge.data(), &length, 8);
    rejects(huge, "exceeds the file");
  }
  rejects(bytes.substr(0, 8) + std::string(bytes.size() - 8, '{'), "not valid JSON");
  rejects(bytes.substr(0, bytes.size() - 1), "truncated");
  rejects(bytes + "xyz", "bytes after the last tensor");
  {
    std::string flipped = bytes;
    flipped[start + 5] = static_cast<char>(flipped[start + 5] ^ 0x10);  // inside "wte"
    rejects(flipped, "tensor 'wte' fails its checksum");
  }
  {
    nlohmann::json h = header;
    h["wte"]["dtype"] = "F64";
    rejects(with_header(bytes, h), "tensor 'wte' has dtype \"F64\", which Loom does not hold");
  }
  {
    nlohmann::json h = header;
    h["wte"]["shape"] = {5, 4};
    rejects(with_header(bytes, h), "needs 80 bytes, but its data_offsets [0, 60) hold 60");
  }
  {
    nlohmann::json h = header;
    h["half"]["data_offsets"][0] = h["half"]["data_offsets"][0].get<int64_t>() - 2;
    h["half"]["data_offsets"][1] = h["half"]["data_offsets"][1].get<int64_t>() - 2;
    rejects(with_header(bytes, h), "overlaps the tensor before it");
  }
  {
    nlohmann::json h = header;
    h["wte"]["shape"] = {-1, 3};
    rejects(with_header(bytes, h), "not a non-negative integer");
  }
  {
    nlohmann::json h = header;
    h["wte"]["shape"] = {int64_t{1} << 40, int64_t{1} << 40};
    rejects(with_header(bytes, h), "needs more bytes than the file has");
  }
  {
    nlohmann::json h = header;
    h["__metadata__"]["loom.tensors"] = "{";
    rejects(with_header(bytes, h), "\"loom.tensors\" is not valid JSON");
  }
  {
    nlohmann::json h = header;
    auto records = nlohmann::json::parse(h["__metadata__"]["loom.tensors"].get<std::string>());
    records["ids"]["offsets"] = {2, 6};
    h["__metadata__"]["loom.tensors"] = records.dump();
    rejects(with_header(bytes, h), "does not fit in the global shape [4, 8]");
  }
}

TEST_CASE("safetensors: a file without Loom's records loads as whole tensors", "[checkpoint]") {
  // As written by another tool: no "loom.tensors", no checksums, no shards.
  loom::test::TempDir dir;
  const fs::path path = dir.path() / "foreign.safetensors";
  const std::vector<float> values{1.5f, -2.0f, 3.25f};
  const std::string text =
      R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"__metadata__":{"format":"pt"}})";
  const uint64_t length = text.size();
  write_file(path, std::string(reinterpret_cast<const char*>(&length), 8) + text +
                       std::string(reinterpret_cast<const char*>(values.data()), 12));
  const auto file = load_safetensors(path);
  REQUIRE(file.tensors.size() == 1);
  CHECK(file.tensors[0].tensor.to_vector<float>() == values);
  CHECK_FALSE(file.tensors[0].shard.has_value());
  CHECK(file.metadata.at("format") == "pt");
}
