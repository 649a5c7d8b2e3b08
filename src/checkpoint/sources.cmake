# checkpoint/: tensors on disk (safetensors files with Loom's shard metadata).
target_sources(loom PRIVATE
  checkpoint/crc32c.cpp
  checkpoint/safetensors.cpp
)
