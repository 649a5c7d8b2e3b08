// Internal: 64-byte aligned, per-thread scratch buffers of the packed GEMMs,
// one per slot, each growing to the largest request and kept for the next call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace loom::kernels::cpu {

// Every user has its own slots, so that one kernel may call another (the bf16
// fallback runs the f32 kernel) while its buffers are live.
enum class ScratchSlot : int { f32_a, f32_b, bf16_a, bf16_b, bf16_partial, count };

// `elements` of 4-byte T in `slot`'s buffer (contents unspecified).
template <typename T>
T* scratch(ScratchSlot slot, int64_t elements) {
  static_assert(sizeof(T) == 4);
  struct AlignedDelete {
    void operator()(uint32_t* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  struct Buffer {
    std::unique_ptr<uint32_t[], AlignedDelete> data;
    int64_t size = 0;
  };
  thread_local Buffer buffers[static_cast<int>(ScratchSlot::count)];
  Buffer& buffer = buffers[static_cast<int>(slot)];
  if (buffer.size < elements) {
    buffer.data.reset(static_cast<uint32_t*>(
        ::operator new[](static_cast<size_t>(elements) * 4, std::align_val_t{64})));
    buffer.size = elements;
  }
  return reinterpret_cast<T*>(buffer.data.get());
}

}  // namespace loom::kernels::cpu
