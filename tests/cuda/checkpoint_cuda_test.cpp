// Distributed checkpoints of a CUDA run (issue 15, "where a GPU is available"):
// a GPT on cuda:0 trained with AdamW through ZeroOptimizer saves after 2
// steps (synchronously and asynchronously: the state is copied off the
// device); resumed on the device it continues bit for bit, and the same
// checkpoint loads into a host model whose parameters equal the device's.
#include <catch2/catch.hpp>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "loom/checkpoint/distributed.hpp"
#include "loom/comm/local.hpp"
#include "loom/comm/nccl.hpp"
#include "loom/models/gpt.hpp"
#include "loom/nn/cross_entropy_loss.hpp"
#include "loom/parallel/zero.hpp"
#include "support/small_gpt.hpp"

using namespace loom;
namespace fs = std::filesystem;

namespace {

struct Run {
  std::vector<float> losses;
  std::vector<std::vector<float>> params;  // at the end, on the host
  std::string error;
};

// Steps [first, last) of a small GPT on `device`; saves after step `save_after`
// (async or not) into `dir`, or resumes from `resume` first.
Run train(Device device, int first, int last, const fs::path& dir, int save_after, bool async,
          const fs::path& resume) {
  Run out;
  comm::run_local_ranks(comm::make_local_group(1), [&](comm::Communicator& world) {
    try {
      // The local backend moves host tensors only: on the device the optimizer
      // reduces through a one-rank NCCL communicator, and the checkpoint's
      // barriers and messages (host tensors) go through `world`.
      std::shared_ptr<comm::Communicator> on_device;
      if (device.is_cuda())
        on_device = comm::make_nccl_communicator(world.shared_from_this(), device);
      models::GPTConfig config = test::small_gpt();
      config.module.device = device;
      models::GPT model("", config);
      parallel::ZeroOptimizer zero(model.parameters(), on_device ? *on_device : world,
                                   optim::AdamWOptions{.lr = 3e-3}, {.stage = 0});
      if (!resume.empty()) checkpoint::load_checkpoint(resume, zero, 0);
      checkpoint::AsyncCheckpointer saver;
      nn::CrossEntropyLoss loss;
      for (int s = first; s < last; ++s) {
        std::vector<int32_t> ids(32), targets(32);
        for (size_t i = 0; i < ids.size(); ++i) {
          ids[i] = static_cast<int32_t>((i * 37 + static_cast<size_t>(s) * 11) % 61);
          targets[i] = static_cast<int32_t>((i * 53 + static_cast<size_t>(s) * 5 + 1) % 61);
        }
        zero.zero_grad();
        nn::Tape tape, loss_tape;
        const Tensor logits = model.forward(Tensor::from_vector(ids, {2, 16}).to(device), tape);
        out.losses.push_back(
            loss.forward(logits, Tensor::from_vector(targets, {2, 16}).to(device), loss_tape)
                .item<float>());
        model.backward(loss.backward(loss_tape), tape);
        zero.finish();
        zero.step();
        if (s == save_after) {
          if (async) {
            saver.save(dir, world, zero, {.step = s + 1});
          } else {
            checkpoint::save_checkpoint(dir, world, zero, {.step = s + 1});
          }
        }
      }
      saver.wait();
      zero.wait_parameters();
      for (nn::Parameter* p : model.parameters()) {
        out.params.push_back(p->value().to(Device::cpu()).to_vector<float>());
      }
    } catch (const std::exception& e) {
      out.error = e.what();
    }
  });
  return out;
}

}  // namespace

TEST_CASE("a CUDA run's checkpoint resumes bit for bit on the device and loads into a host model",
          "[cuda][checkpoint]") {
  const Device gpu = Device::cuda(0);
  for (const bool async : {false, true}) {
    INFO((async ? "asynchronous save" : "synchronous save"));
    const fs::path dir =
        fs::temp_directory_path() / (async ? "loom_cuda_ckpt_async" : "loom_cuda_ckpt_sync");
    fs::remove_all(dir);
    const Run whole = train(gpu, 0, 5, dir, 1, async, {});
    REQUIRE(whole.error.empty());
    const fs::path step_dir = checkpoint::step_directory(dir, 2);
    REQUIRE(fs::exists(step_dir / "manifest.json"));

    const Run resumed = train(gpu, 2, 5, {}, -1, false, step_dir);
    REQUIRE(resumed.error.empty());
    REQUIRE(resumed.losses.size() == 3);
    for (int s = 0; s < 3; ++s) CHECK(resumed.losses[s] == whole.losses[2 + s]);
    CHECK(resumed.params == whole.params);

    // The device checkpoint on the host: the state at step 2 as saved, so
    // resuming the host run from it must start from the device's values.
    const Run on_host = train(Device::cpu(), 2, 2, {}, -1, false, step_dir);
    REQUIRE(on_host.error.empty());
    const Run device_at_2 = train(gpu, 0, 2, {}, -1, false, {});
    REQUIRE(device_at_2.error.empty());
    CHECK(on_host.params == device_at_2.params);
    fs::remove_all(dir);
  }
}
