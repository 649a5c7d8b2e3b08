# parallel/: the parallel layout, data parallelism (gradient reducer, synchronized BatchNorm,
# ZeRO), tensor-parallel layers and pipeline schedules (pipeline/).
target_sources(loom PRIVATE
  parallel/control.cpp
  parallel/grad_buckets.cpp
  parallel/grad_clip.cpp
  parallel/grad_reducer.cpp
  parallel/layout.cpp
  parallel/mean_over.cpp
  parallel/planner.cpp
  parallel/planner_search.cpp
  parallel/pipeline/executor.cpp
  parallel/pipeline/forward_pass.cpp
  parallel/pipeline/generators.cpp
  parallel/pipeline/gpt_chunks.cpp
  parallel/pipeline/partition.cpp
  parallel/pipeline/print.cpp
  parallel/pipeline/replay.cpp
  parallel/pipeline/resnet_chunks.cpp
  parallel/pipeline/schedule.cpp
  parallel/pipeline/schedule_checks.cpp
  parallel/pipeline/simulate.cpp
  parallel/pipeline/stage_messages.cpp
  parallel/pipeline/validate.cpp
  parallel/pipeline/zb_v_order.cpp
  parallel/reducer_stats.cpp
  parallel/reduction.cpp
  parallel/sharded_module.cpp
  parallel/sync_batch_norm.cpp
  parallel/tensor_parallel.cpp
  parallel/tensor_parallel_gpt.cpp
  parallel/train_step.cpp
  parallel/vocab_parallel.cpp
  parallel/zero_gather.cpp
  parallel/zero_grads.cpp
  parallel/zero_layout.cpp
  parallel/zero_optimizer.cpp
)
