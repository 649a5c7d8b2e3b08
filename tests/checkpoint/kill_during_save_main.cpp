// loom_kill_during_save MODE DIR: a data-parallel GPT under mpirun (2 ranks)
// whose rank 1 is killed (SIGKILL) in the middle of a checkpoint save.
//
//   train   saves after steps 2 and 4; during the second save rank 1 is killed
//           after writing its file, before the manifest: the job must fail,
//           leaving step-00000004 without a manifest.
//   train-async  the same with AsyncCheckpointer: rank 1 is killed in its
//           writer thread while training goes on, before its file is written.
//   resume  --resume from DIR: must start from step-00000002, the newest
//           complete checkpoint, and train steps 2 and 3.
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include "loom/loom.hpp"
#include "support/small_gpt.hpp"

namespace {

int run(const std::string& mode, const std::string& dir) {
  using namespace loom;
  Context context = init();
  comm::Communicator& world = *context.world();
  models::GPT model("", test::small_gpt());
  parallel::ZeroOptimizer zero(model.parameters(), world, optim::AdamWOptions{.lr = 3e-3},
                               {.stage = 1});
  nn::CrossEntropyLoss loss;
  int64_t first = 0, last = mode == "train-async" ? 6 : 4;  // async: train on past the save
  checkpoint::AsyncCheckpointer saver;
  if (mode == "resume") {
    const auto latest = checkpoint::latest_checkpoint(dir);
    LOOM_CHECK(latest.has_value(), "no complete checkpoint in ", dir);
    first = checkpoint::load_checkpoint(*latest, zero, world.rank()).step;
    if (world.rank() == 0) {
      std::printf("resumed from %s at step %lld\n", latest->string().c_str(),
                  static_cast<long long>(first));
    }
  }
  for (int64_t s = first; s < last; ++s) {
    std::vector<int32_t> ids(2 * 16), targets(2 * 16);
    for (size_t i = 0; i < ids.size(); ++i) {
      const size_t g = static_cast<size_t>(world.rank()) * ids.size() + i;
      ids[i] = static_cast<int32_t>((g * 37 + static_cast<size_t>(s) * 11) % 61);
      targets[i] = static_cast<int32_t>((g * 53 + static_cast<size_t>(s) * 5 + 1) % 61);
    }
    zero.zero_grad();
    nn::Tape tape, loss_tape;
    const Tensor logits = model.forward(Tensor::from_vector(ids, {2, 16}), tape);
    const double value =
        loss.forward(logits, Tensor::from_vector(targets, {2, 16}), loss_tape).item<float>();
    model.backward(loss.backward(loss_tape), tape);
    zero.finish();
    zero.step();
    if (world.rank() == 0) std::printf("step %lld loss %.6f\n", static_cast<long long>(s), value);
    if (mode != "resume" && (s + 1) % 2 == 0) {
      const bool kill = s + 1 == 4 && world.rank() == 1;
      const checkpoint::SaveOptions options{.dp_rank = world.rank(), .before_manifest = [kill] {
                                              if (kill) std::raise(SIGKILL);
                                            }};
      if (mode == "train") {
        checkpoint::save_checkpoint(dir, world, zero, {.step = s + 1}, options);
      } else {
        saver.save(dir, world, zero, {.step = s + 1}, options);
      }
    }
  }
  saver.wait();
  zero.wait_parameters();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: loom_kill_during_save train|train-async|resume DIR\n");
    return 2;
  }
  return run(argv[1], argv[2]);
}
