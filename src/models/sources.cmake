# models/: reference networks built from nn modules.
target_sources(loom PRIVATE
  models/gpt.cpp
  models/gpt_flops.cpp
  models/gpt_generate.cpp
  models/gpt_memory.cpp
  models/kv_cache.cpp
  models/resnet.cpp
)
