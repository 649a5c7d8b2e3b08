# optim/: optimizers, learning-rate schedules, gradient clipping.
target_sources(loom PRIVATE
  optim/adamw.cpp
  optim/grad_clip.cpp
  optim/loss_scaler.cpp
  optim/lr_schedule.cpp
  optim/optimizer.cpp
  optim/param_slot.cpp
  optim/sgd.cpp
)
