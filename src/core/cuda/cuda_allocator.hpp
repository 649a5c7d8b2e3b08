// Internal: the CUDA caching allocator of one device (see core/caching_allocator.hpp
// for the device-independent caching logic it is built on).
#pragma once

#include <memory>

#include "loom/core/allocator.hpp"

namespace loom::detail {

std::unique_ptr<Allocator> make_cuda_caching_allocator(int device);

}  // namespace loom::detail
