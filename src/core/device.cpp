#include "loom/core/device.hpp"

#include <charconv>
#include <mutex>

#include "loom/config.hpp"
#include "loom/core/error.hpp"
#include "loom/core/logging.hpp"

#if LOOM_HAS_CUDA
#include "core/cuda/runtime.hpp"
#endif

namespace loom {
namespace {

struct CudaAvailability {
  int count = 0;
  std::string reason;
};

const CudaAvailability& cuda_availability() {
  static const CudaAvailability availability = [] {
    CudaAvailability a;
#if LOOM_HAS_CUDA
    a.count = detail::cuda::device_count(&a.reason);
#else
    a.reason = "Loom was built without CUDA (LOOM_WITH_CUDA=OFF or no CUDA toolkit at build time)";
#endif
    return a;
  }();
  return availability;
}

}  // namespace

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

std::ostream& operator<<(std::ostream& out, const Device& device) {
  return out << device.str();
}

Device parse_device(std::string_view text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.starts_with("cuda:")) {
    const std::string_view digits = text.substr(5);
    int index = -1;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (error == std::errc() && end == digits.data() + digits.size() && index >= 0 &&
        !digits.empty()) {
      return Device::cuda(index);
    }
  }
  throw Error(str_cat("device '", text, "' is not 'cpu', 'cuda' or 'cuda:N' with N >= 0"));
}

bool built_with_cuda() {
  return LOOM_HAS_CUDA != 0;
}
bool built_with_nccl() {
  return LOOM_HAS_NCCL != 0;
}

int cuda_device_count() {
  return cuda_availability().count;
}

std::string cuda_unavailable_reason() {
  return cuda_availability().reason;
}

void set_device(Device device) {
  if (device.is_cpu()) return;
  const int count = cuda_device_count();
  LOOM_CHECK(device.index >= 0 && device.index < count, "device ", device,
             " does not exist: this process sees ", count, " CUDA device(s)",
             count == 0 ? " (" + cuda_unavailable_reason() + ")" : std::string());
#if LOOM_HAS_CUDA
  detail::cuda::set_device(device.index);
#endif
}

Device current_device() {
  if (cuda_device_count() == 0) return Device::cpu();
#if LOOM_HAS_CUDA
  return Device::cuda(detail::cuda::get_device());
#else
  return Device::cpu();
#endif
}

Device device_for_local_rank(int local_rank) {
  LOOM_CHECK(local_rank >= 0, "local rank ", local_rank, " must be >= 0");
  const int count = cuda_device_count();
  if (count == 0) return Device::cpu();
  static std::once_flag warned;
  if (local_rank >= count) {
    std::call_once(warned, [&] {
      LOOM_LOG_WARN("local rank ", local_rank, " but only ", count,
                    " CUDA device(s): several ranks will share a GPU (device = local rank % ",
                    count, ")");
    });
  }
  return Device::cuda(local_rank % count);
}

DeviceGuard::DeviceGuard(Device device) {
  if (device.is_cpu()) return;
#if LOOM_HAS_CUDA
  previous_ = detail::cuda::get_device();
  if (previous_ != device.index) {
    set_device(device);
  } else {
    previous_ = -1;
  }
#else
  set_device(device);  // throws: no CUDA devices
#endif
}

DeviceGuard::~DeviceGuard() {
#if LOOM_HAS_CUDA
  if (previous_ >= 0) {
    try {
      detail::cuda::set_device(previous_);
    } catch (const std::exception& e) {
      // A destructor must not throw; say what went wrong instead.
      LOOM_LOG_WARN("DeviceGuard could not restore cuda:", previous_, ": ", e.what());
    }
  }
#endif
}

}  // namespace loom
