// Loom: everything a training program needs, in one include.
#pragma once

#include "loom/config.hpp"
#include "loom/core/allocator.hpp"
#include "loom/core/device.hpp"
#include "loom/core/dtype.hpp"
#include "loom/core/error.hpp"
#include "loom/core/half.hpp"
#include "loom/core/logging.hpp"
#include "loom/core/philox.hpp"
#include "loom/core/random.hpp"
#include "loom/core/storage.hpp"
#include "loom/core/stream.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/cost.hpp"
#include "loom/kernels/elementwise.hpp"
#include "loom/kernels/gemm.hpp"
#include "loom/kernels/reduce.hpp"
