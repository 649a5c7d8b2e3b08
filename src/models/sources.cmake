# models/: reference networks built from nn modules.
target_sources(loom PRIVATE
  models/gpt.cpp
  models/resnet.cpp
)
