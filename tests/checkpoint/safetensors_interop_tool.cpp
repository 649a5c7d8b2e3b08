// The Loom side of tests/checkpoint/safetensors_interop.py:
//
//   safetensors_interop_tool write FILE   saves the reference tensors with Loom
//   safetensors_interop_tool check FILE   loads FILE (written by the safetensors
//                                         package) and compares it bit for bit
//
// The reference tensors are defined by formulas that the Python side computes
// the same way (see reference() there): exact in every dtype, so "equal" means
// equal bits.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "loom/checkpoint/safetensors.hpp"

using loom::DType;
using loom::Tensor;
using loom::checkpoint::ShardPlacement;
using loom::checkpoint::StoredTensor;

namespace {

std::vector<StoredTensor> reference() {
  std::vector<float> f32(15), f16(8);
  for (int i = 0; i < 15; ++i) f32[i] = static_cast<float>(i * 0.37 - 2.0);
  for (int i = 0; i < 8; ++i) f16[i] = (i - 4) * 0.5f;
  Tensor bf16 = Tensor::empty({2, 3}, DType::bf16);
  auto* bits = bf16.data<loom::bfloat16>();
  for (int i = 0; i < 6; ++i) bits[i] = loom::bfloat16::from_bits(0x3F80 + 37 * i);
  std::vector<int32_t> i32(4);
  std::vector<int64_t> i64(3);
  for (int i = 0; i < 4; ++i) i32[i] = i * 7 - 20;
  for (int i = 0; i < 3; ++i) i64[i] = i * 1000000000000LL + 3;
  return {
      {"f32", Tensor::from_vector(f32, {3, 5}), std::nullopt},
      {"bf16", bf16, ShardPlacement{{4, 3}, {2, 0}}},
      {"f16", Tensor::from_vector(f16, {8}).to(DType::f16), std::nullopt},
      {"i32", Tensor::from_vector(i32, {2, 2}), std::nullopt},
      {"i64", Tensor::from_vector(i64, {3}), std::nullopt},
  };
}

int check(const std::string& path) {
  const auto file = loom::checkpoint::load_safetensors(path);
  int failures = 0;
  for (const StoredTensor& want : reference()) {
    const Tensor& got = file.at(want.name).tensor;
    if (got.dtype() != want.tensor.dtype() || got.shape() != want.tensor.shape() ||
        std::memcmp(got.data(), want.tensor.data(), got.nbytes()) != 0) {
      std::printf("tensor '%s' differs: loaded %s, expected %s\n", want.name.c_str(),
                  got.str().c_str(), want.tensor.str().c_str());
      ++failures;
    }
  }
  if (file.tensors.size() != reference().size()) {
    std::printf("%zu tensors loaded, %zu expected\n", file.tensors.size(), reference().size());
    ++failures;
  }
  if (file.metadata.count("written_by") == 0 || file.metadata.at("written_by") != "safetensors") {
    std::printf("metadata 'written_by' is missing or wrong\n");
    ++failures;
  }
  std::printf("%s: %zu tensors, %s\n", path.c_str(), file.tensors.size(),
              failures ? "MISMATCH" : "all equal bit for bit");
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "write") != 0 && std::strcmp(argv[1], "check") != 0)) {
    std::fprintf(stderr, "usage: %s write|check FILE\n", argv[0]);
    return 2;
  }
  try {
    if (std::strcmp(argv[1], "write") == 0) {
      loom::checkpoint::save_safetensors(argv[2], reference(), {{"written_by", "loom"}});
      return 0;
    }
    return check(argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
