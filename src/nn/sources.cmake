# nn/: modules with explicit forward/backward (DESIGN.md decision 1).
target_sources(loom PRIVATE
  nn/batch_norm.cpp
  nn/conv2d.cpp
  nn/module.cpp
  nn/parameter.cpp
  nn/pool.cpp
)
