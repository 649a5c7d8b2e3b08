// loom-ckpt: look into a distributed checkpoint (checkpoint/distributed.hpp).
//
//   loom-ckpt inspect PATH                 the step, the saving run's ranks, the
//                                          files, every parameter's global shape,
//                                          stored kinds, pieces and bytes
//   loom-ckpt verify PATH                  every checksum, every record's fit, and
//                                          every element of every tensor present;
//                                          exit 1 naming the first problem
//   loom-ckpt consolidate PATH OUT [--gpt2]
//                                          one safetensors file of the whole
//                                          parameters (values only); --gpt2 writes
//                                          the blocks' linear weights as GPT-2's
//                                          Conv1D [in, out], as Hugging Face's
//                                          GPT-2 loads them, and config.json
//                                          beside OUT where the checkpoint records
//                                          the model's sizes (checkpoint/gpt2.hpp)
//
// PATH is a step directory (with manifest.json) or a directory of checkpoints,
// whose newest complete one is taken.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "loom/checkpoint/distributed.hpp"
#include "loom/checkpoint/gpt2.hpp"
#include "loom/checkpoint/safetensors.hpp"
#include "loom/core/error.hpp"

namespace {

namespace ckpt = loom::checkpoint;
namespace fs = std::filesystem;

fs::path resolve(const fs::path& path) {
  if (fs::exists(path / "manifest.json")) return path;
  const auto latest = ckpt::latest_checkpoint(path);
  LOOM_CHECK(latest.has_value(), path,
             " is neither a checkpoint step directory (no manifest.json)"
             " nor a directory holding a complete checkpoint");
  return *latest;
}

std::string shape_text(const loom::Shape& s) {
  return loom::shape_str(s);
}

int inspect(const fs::path& dir) {
  const ckpt::CheckpointReader reader(dir);
  std::printf("checkpoint %s\n  step %lld, saved by %d rank(s), optimizer step %lld\n",
              dir.string().c_str(), static_cast<long long>(reader.state().step), reader.world(),
              static_cast<long long>(reader.optimizer_steps()));
  for (const auto& [key, value] : reader.state().info) {
    std::printf("  %s = %s\n", key.c_str(), value.c_str());
  }
  int64_t total = 0;
  for (const std::string& f : reader.files()) {
    const auto bytes = static_cast<int64_t>(fs::file_size(dir / f));
    total += bytes;
    std::printf("  %s  %lld bytes\n", f.c_str(), static_cast<long long>(bytes));
  }
  std::printf("  %zu parameters, %lld bytes on disk\n\n", reader.params().size(),
              static_cast<long long>(total));
  std::printf("  %-40s %-16s %7s %12s  %s\n", "parameter", "global shape", "pieces", "bytes",
              "kinds");
  for (const auto& [name, info] : reader.params()) {
    std::string kinds;
    for (const std::string& k : info.kinds) kinds += (kinds.empty() ? "" : ", ") + k;
    std::printf("  %-40s %-16s %7lld %12lld  %s\n", name.c_str(),
                shape_text(info.global_shape).c_str(), static_cast<long long>(info.records),
                static_cast<long long>(info.bytes), kinds.c_str());
  }
  return 0;
}

int verify(const fs::path& dir) {
  const ckpt::CheckpointReader reader(dir);  // checksums, records
  int64_t tensors = 0;
  for (const auto& [name, info] : reader.params()) {
    for (const std::string& kind : info.kinds) {
      reader.assemble(name, kind);  // every element present
      ++tensors;
    }
  }
  std::printf("ok: %s: %zu files, %zu parameters, %lld tensors complete, checksums verified\n",
              dir.string().c_str(), reader.files().size(), reader.params().size(),
              static_cast<long long>(tensors));
  return 0;
}

int consolidate(const fs::path& dir, const fs::path& out, bool gpt2) {
  const ckpt::CheckpointReader reader(dir);
  std::vector<ckpt::StoredTensor> tensors;
  for (const auto& [name, info] : reader.params()) {
    // The f32 master weights of a bf16/f16 run where it saved them (NOTE
    // [master records] in src/checkpoint/distributed.cpp), else the values;
    // a buffer (BatchNorm's running statistics: NOTE [buffer records]) as it is.
    auto has = [&](const char* kind) {
      return std::find(info.kinds.begin(), info.kinds.end(), kind) != info.kinds.end();
    };
    loom::Tensor value = reader.assemble(name, has("master")  ? "master"
                                               : has("value") ? "value"
                                                              : "buffer");
    if (gpt2) value = ckpt::gpt2_conv1d_transposed(name, value);
    tensors.push_back({name, value, std::nullopt});
  }
  ckpt::save_safetensors(out, tensors,
                         {{"format", "pt"}, {"step", std::to_string(reader.state().step)}});
  std::printf("wrote %s: %zu whole tensors of step %lld%s\n", out.string().c_str(), tensors.size(),
              static_cast<long long>(reader.state().step), gpt2 ? " (GPT-2 Conv1D layout)" : "");
  if (gpt2) {
    // Hugging Face's GPT2LMHeadModel.from_pretrained(folder) reads
    // config.json and model.safetensors from one folder.
    const fs::path config = out.parent_path() / "config.json";
    if (ckpt::write_gpt2_config(config, reader.state().info)) {
      std::printf("wrote %s%s\n", config.string().c_str(),
                  out.filename() == "model.safetensors"
                      ? ""
                      : " (Hugging Face looks for the weights as model.safetensors beside it)");
    } else {
      std::printf("no config.json: the checkpoint does not record the model's sizes\n");
    }
  }
  return 0;
}

int usage() {
  std::fprintf(stderr,
               "usage: loom-ckpt inspect PATH | verify PATH | consolidate PATH OUT [--gpt2]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return usage();
  const std::string command = argv[1];
  try {
    const fs::path dir = resolve(argv[2]);
    if (command == "inspect" && argc == 3) return inspect(dir);
    if (command == "verify" && argc == 3) return verify(dir);
    if (command == "consolidate" && (argc == 4 || argc == 5)) {
      const bool gpt2 = argc == 5 && std::string(argv[4]) == "--gpt2";
      if (argc == 5 && !gpt2) return usage();
      return consolidate(dir, argv[3], gpt2);
    }
    return usage();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom-ckpt %s: %s\n", command.c_str(), e.what());
    return 1;
  }
}
