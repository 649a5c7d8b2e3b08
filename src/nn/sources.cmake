# nn/: modules with explicit forward/backward (docs/design.md, decision 1).
target_sources(loom PRIVATE
  nn/attention.cpp
  nn/activation.cpp
  nn/batch_norm.cpp
  nn/checkpoint.cpp
  nn/conv2d.cpp
  nn/cross_entropy_loss.cpp
  nn/dropout.cpp
  nn/embedding.cpp
  nn/evaluation.cpp
  nn/layer_norm.cpp
  nn/linear.cpp
  nn/mlp.cpp
  nn/module.cpp
  nn/parameter.cpp
  nn/pool.cpp
  nn/precision.cpp
  nn/residual.cpp
  nn/sequential.cpp
)
