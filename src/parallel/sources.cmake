# parallel/: the parallel layout and data parallelism (gradient reducer, synchronized BatchNorm).
target_sources(loom PRIVATE
  parallel/control.cpp
  parallel/grad_reducer.cpp
  parallel/layout.cpp
  parallel/reducer_stats.cpp
  parallel/sync_batch_norm.cpp
)
