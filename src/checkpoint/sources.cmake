# checkpoint/: tensors on disk (safetensors files with Loom's shard metadata) and
# distributed checkpoints of parameters and ZeRO state.
target_sources(loom PRIVATE
  checkpoint/async_save.cpp
  checkpoint/crc32c.cpp
  checkpoint/distributed.cpp
  checkpoint/gpt2.cpp
  checkpoint/reader.cpp
  checkpoint/records.cpp
  checkpoint/safetensors.cpp
)
