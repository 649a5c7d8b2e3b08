// Internal: the CUDA runtime calls core/ needs, behind plain C++ types so that
// files including this header need neither nvcc nor cuda_runtime.h. Only
// compiled when LOOM_HAS_CUDA; every function throws loom::LibraryError on failure.
#pragma once

#include <cstddef>
#include <string>

namespace loom::detail::cuda {

// Number of usable devices; 0 with `reason` filled when there are none.
int device_count(std::string* reason);
void set_device(int device);
int get_device();

void* stream_create(int device, bool high_priority);
void stream_destroy(void* stream) noexcept;
void stream_synchronize(void* stream);
bool stream_query(void* stream);
void stream_wait_event(void* stream, void* event);

void* event_create(int device, bool enable_timing);
void event_destroy(void* event) noexcept;
void event_record(void* event, void* stream);
void event_synchronize(void* event);
bool event_query(void* event);
float event_elapsed_ms(void* start, void* end);

enum class CopyKind { host_to_device, device_to_host, device_to_device };
// Queues the copy on `stream`; host_to_device and device_to_host also wait for it.
void memcpy(void* dst, const void* src, size_t bytes, CopyKind kind, void* stream);

// Raw device memory for the caching allocator: nullptr when out of memory.
void* malloc_or_null(int device, size_t bytes);
void free(int device, void* ptr) noexcept;
// Free and total bytes of the device.
void mem_info(int device, size_t* free_bytes, size_t* total_bytes);

}  // namespace loom::detail::cuda
