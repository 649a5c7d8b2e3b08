// Buffers in distributed checkpoints (NOTE [buffer records] in
// src/checkpoint/distributed.cpp): ResNet-18's BatchNorm running statistics,
// which training changes and no optimizer steps, saved beside the parameters
// and restored bit for bit; a model whose buffers the checkpoint lacks is
// refused naming one.
#include <catch2/catch.hpp>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "loom/checkpoint/distributed.hpp"
#include "loom/comm/local.hpp"
#include "loom/data/synthetic.hpp"
#include "loom/models/resnet.hpp"
#include "loom/parallel/sync_batch_norm.hpp"
#include "loom/parallel/zero.hpp"

using namespace loom;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

std::unique_ptr<nn::Sequential> small_resnet(uint64_t seed) {
  return models::make_resnet("", models::resnet18({.stem = models::ResNetStem::cifar,
                                                   .classes = 10,
                                                   .width = 8,
                                                   .module = {.seed = seed}}));
}

// Training-mode forwards move the running statistics away from 0 and 1.
void run_forwards(nn::Module& model, uint64_t seed) {
  for (int i = 0; i < 2; ++i) {
    nn::Tape tape;
    model.forward(data::synthetic_image_batch({.height = 16, .width = 16}, 4, seed, i).images,
                  tape);
  }
}

std::vector<std::vector<float>> values_of(const std::vector<nn::Buffer>& buffers) {
  std::vector<std::vector<float>> out;
  for (const nn::Buffer& b : buffers) out.push_back(b.value.to_vector<float>());
  return out;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("loom_buffer_ckpt_test_" + name);
  fs::remove_all(dir);
  return dir;
}

}  // namespace

TEST_CASE("Module::buffers: every BatchNorm's running mean and variance, named", "[checkpoint]") {
  auto model = small_resnet(1);
  const std::vector<nn::Buffer> buffers = model->buffers();
  const size_t norms = parallel::find_batch_norms(*model).size();
  REQUIRE(norms > 0);
  CHECK(buffers.size() == 2 * norms);
  CHECK(buffers[0].name == "bn1.running_mean");
  CHECK(buffers[1].name == "bn1.running_var");
  // The handles are the layers' own tensors.
  buffers[0].value.copy_from(Tensor::full(buffers[0].value.shape(), 3.0));
  CHECK(parallel::find_batch_norms(*model)[0]->running_mean().to_vector<float>()[0] == 3.0f);
}

TEST_CASE("checkpoints keep BatchNorm's running statistics, written once over dp", "[checkpoint]") {
  const fs::path dir = fresh_dir("dp2");
  // 2 data-parallel ranks, ZeRO-1, per-rank BatchNorm: the ranks' statistics
  // differ; dp rank 0's are saved, and both ranks load them.
  std::vector<std::vector<std::vector<float>>> saved(2);
  std::vector<std::string> errors(2);
  comm::run_local_ranks(comm::make_local_group(2, "dp"), [&](comm::Communicator& dp) {
    const auto r = static_cast<size_t>(dp.rank());
    auto model = small_resnet(1);
    parallel::ZeroOptimizer zero(model->parameters(), dp, optim::SgdOptions{.lr = 0.1},
                                 {.stage = 1});
    run_forwards(*model, 7 + r);
    saved[r] = values_of(model->buffers());
    checkpoint::save_checkpoint(dir, dp, zero, {.step = 3},
                                {.dp_rank = dp.rank(), .buffers = model->buffers()});

    auto fresh = small_resnet(2);
    parallel::ZeroOptimizer fresh_zero(fresh->parameters(), dp, optim::SgdOptions{.lr = 0.1},
                                       {.stage = 1});
    const std::vector<nn::Buffer> buffers = fresh->buffers();
    checkpoint::load_checkpoint(checkpoint::step_directory(dir, 3), fresh_zero, dp.rank(), dp,
                                buffers);
    if (values_of(buffers) != saved[0]) errors[r] += "rank's buffers are not dp rank 0's; ";
  });
  CHECK(saved[0] != saved[1]);
  for (const std::string& e : errors) CHECK(e.empty());

  // The buffers are in rank 0's file only; the weights alone load them too.
  const checkpoint::CheckpointReader reader(checkpoint::step_directory(dir, 3));
  size_t buffer_entries = 0;
  for (const auto& [name, info] : reader.params()) {
    if (info.kinds == std::vector<std::string>{"buffer"}) ++buffer_entries;
  }
  auto probe = small_resnet(3);
  CHECK(buffer_entries == probe->buffers().size());
  checkpoint::load_checkpoint_weights(checkpoint::step_directory(dir, 3), *probe);
  CHECK(values_of(probe->buffers()) == saved[0]);
}

TEST_CASE("a checkpoint without a model's buffers is refused naming one", "[checkpoint]") {
  const fs::path dir = fresh_dir("bare");
  auto group = comm::make_local_group(1, "solo");
  auto model = small_resnet(1);
  parallel::ZeroOptimizer zero(model->parameters(), *group[0], optim::SgdOptions{.lr = 0.1});
  checkpoint::save_checkpoint(dir, *group[0], zero, {.step = 1});  // no buffers
  const fs::path step = checkpoint::step_directory(dir, 1);
  const std::vector<nn::Buffer> buffers = model->buffers();
  const std::vector<std::vector<float>> before = values_of(buffers);
  CHECK_THROWS_WITH(checkpoint::load_checkpoint(step, zero, 0, buffers),
                    Contains("buffer 'bn1.running_mean' of the model is in no file (saved without "
                             "SaveOptions::buffers, or of another model?)"));
  CHECK(values_of(buffers) == before);
  CHECK_THROWS_WITH(checkpoint::load_checkpoint_weights(step, *model),
                    Contains("buffer 'bn1.running_mean' of the model is in no file"));
  // Without buffers asked for, the parameters load as before.
  CHECK_NOTHROW(checkpoint::load_checkpoint(step, zero, 0));
}
