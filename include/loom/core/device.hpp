// Where a tensor lives: the host ("cpu") or one CUDA device ("cuda:N").
//
// Device queries work in every build: in a build without CUDA, or on a
// machine without a GPU or driver, cuda_device_count() is 0 and
// cuda_unavailable_reason() says why, in words fit for a skip message.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace loom {

enum class DeviceType : uint8_t { cpu = 0, cuda = 1 };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // CUDA ordinal; 0 for the host

  static constexpr Device cpu() { return Device{DeviceType::cpu, 0}; }
  static constexpr Device cuda(int index = 0) { return Device{DeviceType::cuda, index}; }

  constexpr bool is_cpu() const { return type == DeviceType::cpu; }
  constexpr bool is_cuda() const { return type == DeviceType::cuda; }
  std::string str() const;  // "cpu" or "cuda:N"

  friend constexpr bool operator==(const Device&, const Device&) = default;
};

// Parses "cpu", "cuda" (= cuda:0) and "cuda:N"; throws loom::Error otherwise.
Device parse_device(std::string_view text);

std::ostream& operator<<(std::ostream& out, const Device& device);

// True when Loom was compiled with its CUDA backend.
bool built_with_cuda();
// True when Loom was compiled with NCCL.
bool built_with_nccl();

// Number of CUDA devices this process can use (0 without CUDA, driver or GPU).
int cuda_device_count();
// Why no CUDA device can be used ("" when one can), e.g.
// "no CUDA device found (cudaGetDeviceCount: CUDA driver version is insufficient ...)".
std::string cuda_unavailable_reason();

// Makes `device` current for this thread (a no-op for cpu). Throws if the
// CUDA ordinal is out of range, naming it and the device count.
void set_device(Device device);
// The current CUDA device of this thread (cuda:0 unless set), or cpu if CUDA is unavailable.
Device current_device();

// The device a rank should use given its rank on the node: cuda:(local_rank %
// count) when GPUs are present, else cpu. Logs a warning when several local
// ranks will share one GPU. Does not make the device current.
Device device_for_local_rank(int local_rank);

// RAII: makes `device` current and restores the previous device on exit.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  // -1: nothing to restore
};

}  // namespace loom
