// A complete data-parallel training program: an MLP on the digits, with AdamW,
// warm-up + cosine learning rate, gradient clipping, ZeRO stage 0-3,
// evaluation, and checkpoints it resumes from (on any number of ranks).
// docs/getting-started.md walks through it; a test builds it against the
// installed package and checks that two ranks reproduce one rank's losses and
// that a run resumed from a checkpoint continues them.
//
//   train_digits [ZERO_STAGE] [DIGITS_CSV] [CHECKPOINT_DIR]   (mpirun or srun for several ranks)
#include <loom/loom.hpp>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

using namespace loom;

int main(int argc, char** argv) {
  const int stage = argc > 1 ? std::atoi(argv[1]) : 0;
  const std::string digits = argc > 2 ? argv[2] : data::default_digits_path();
  const std::string checkpoints = argc > 3 ? argv[3] : "";

  // 1. Start the runtime: one process per rank, each knowing its rank and the
  //    world (keep the Context until the end of main).
  Context runtime = init();
  comm::Communicator& dp = *runtime.world();
  const bool lead = dp.rank() == 0;

  // 2. Data: every rank loads the whole (small) dataset; the sampler gives each
  //    rank its slice of every global batch, shuffled alike on every rank.
  const data::TrainTestSplit split =
      data::train_test_split(data::load_digits(digits), data::kDigitsTestCount, /*seed=*/1);
  data::DistributedSampler sampler(
      split.train.size(),
      {.global_batch = 60, .dp_rank = dp.rank(), .dp_size = dp.size(), .seed = 1});

  // 3. The model: 64 pixels -> 128 -> 10 classes. The same seed on every rank
  //    draws the same initial weights (ZeroOptimizer checks they agree).
  auto mlp = std::make_unique<nn::Sequential>("mlp");
  mlp->emplace<nn::Linear>("mlp.fc1", 64, 128, nn::LinearOptions{.module = {.seed = 7}});
  mlp->emplace<nn::ReLU>("mlp.relu");
  mlp->emplace<nn::Linear>("mlp.fc2", 128, 10, nn::LinearOptions{.module = {.seed = 7}});
  // ZeRO stage 3 keeps only a shard of each parameter between uses: each layer
  // is gathered around its forward and backward by a ShardedModule.
  std::vector<parallel::ShardedModule*> units;
  std::unique_ptr<nn::Module> model = std::move(mlp);
  if (stage == 3) {
    units = parallel::shard_children(static_cast<nn::Sequential&>(*model));
  }

  // 4. The optimizer: AdamW, its state (and at stage 2 the gradients, at
  //    stage 3 the parameters too) sharded over the data-parallel ranks. It
  //    averages the gradients over the ranks while backward runs.
  const int64_t epochs = 4, steps = epochs * sampler.batches_per_epoch();
  parallel::ZeroOptimizer zero(model->parameters(), dp,
                               optim::AdamWOptions{.lr = 3e-3, .weight_decay = 0.01},
                               {.stage = stage, .modules = units});
  const optim::WarmupCosine schedule{
      .peak = 3e-3, .min = 3e-4, .warmup_steps = 10, .total_steps = steps};
  nn::CrossEntropyLoss loss_fn;

  // 5. Resume from the newest complete checkpoint, if there is one: the
  //    parameters, AdamW's state and the step, whatever the number of ranks
  //    and the ZeRO stage of the run that saved it.
  int64_t first_epoch = 0;
  if (!checkpoints.empty()) {
    if (const auto latest = checkpoint::latest_checkpoint(checkpoints)) {
      const checkpoint::TrainingState saved = checkpoint::load_checkpoint(*latest, zero, dp.rank());
      first_epoch = saved.step / sampler.batches_per_epoch();  // saved at the end of an epoch
      if (lead) std::printf("resumed from %s\n", latest->string().c_str());
    }
  }

  // 6. Train.
  int64_t step = first_epoch * sampler.batches_per_epoch();
  for (int64_t epoch = first_epoch; epoch < epochs; ++epoch) {
    sampler.set_epoch(epoch);
    for (int64_t b = 0; b < sampler.batches_per_epoch(); ++b, ++step) {
      const data::ImageBatch batch = data::select_rows(split.train, sampler.rank_rows(b));
      const Tensor x = batch.images.view({batch.images.size(0), 64});

      zero.zero_grad();
      nn::Tape tape, loss_tape;
      const Tensor logits = model->forward(x, tape);
      const double loss = loss_fn.forward(logits, batch.labels, loss_tape).item<float>();
      model->backward(loss_fn.backward(loss_tape), tape);
      zero.finish();                                 // gradients averaged over the ranks
      const double norm = zero.clip_grad_norm(1.0);  // the global norm, before clipping
      zero.set_lr(schedule.lr_at(step));
      zero.step();

      const double mean_loss = parallel::mean_over(dp, loss);  // every rank's share
      if (lead && step % 10 == 0) {
        std::printf("step %3lld  loss %.6f  norm %.4f  lr %.2e\n", static_cast<long long>(step),
                    mean_loss, norm, schedule.lr_at(step));
      }
    }
    // 7. A checkpoint at the end of every epoch: each rank writes its shards,
    //    rank 0 the manifest last, so a crash leaves the previous one whole.
    if (!checkpoints.empty()) {
      checkpoint::save_checkpoint(checkpoints, dp, zero, {.step = step}, {.dp_rank = dp.rank()});
    }
  }

  // 8. Evaluate on the held-out rows (every rank evaluates them all here; the
  //    set is small). At stage 3 the parameters are gathered first.
  zero.gather_parameters();
  const Tensor test_x = split.test.images.view({split.test.size(), 64});
  const double accuracy = nn::accuracy(nn::infer(*model, test_x), split.test.labels);
  if (lead) std::printf("test accuracy %.4f\n", accuracy);
  zero.release_parameters();
  return 0;
}
