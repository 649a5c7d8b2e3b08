# nn/: modules with explicit forward/backward (DESIGN.md decision 1).
target_sources(loom PRIVATE
  nn/attention.cpp
  nn/module.cpp
  nn/parameter.cpp
)
