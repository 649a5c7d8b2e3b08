#include "comm/mpi/symmetric_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "loom/core/allocator.hpp"
#include "loom/core/logging.hpp"

namespace loom::comm::mpi {

std::optional<detail::ShmAllReduce::Symmetric> SymmetricRegistry::find(const void* data,
                                                                       size_t bytes) const {
  const auto address = reinterpret_cast<uintptr_t>(data);
  std::lock_guard lock(mutex_);
  auto it = regions_.upper_bound(address);  // the first region starting after `data`
  if (it == regions_.begin()) return std::nullopt;
  --it;
  const uintptr_t base = it->first;
  const Region& region = it->second;
  if (address + bytes > base + region.bytes) return std::nullopt;
  detail::ShmAllReduce::Symmetric operand;
  operand.region = region.id;
  operand.offset = address - base;
  for (char* peer : region.bases) operand.peers.push_back(peer + operand.offset);
  return operand;
}

void SymmetricRegistry::add(int rank, Region region) {
  const auto key = reinterpret_cast<uintptr_t>(region.bases[static_cast<size_t>(rank)]);
  std::lock_guard lock(mutex_);
  regions_.emplace(key, std::move(region));
}

void SymmetricRegistry::remove(const char* own_base) {
  std::lock_guard lock(mutex_);
  regions_.erase(reinterpret_cast<uintptr_t>(own_base));
}

size_t SymmetricRegistry::size() const {
  std::lock_guard lock(mutex_);
  return regions_.size();
}

namespace {

// This rank's file and the views of every rank's file (null where not mapped).
struct Mappings {
  int fd = -1;
  size_t bytes = 0;
  std::vector<char*> views;

  ~Mappings() {
    unmap();
    if (fd >= 0) ::close(fd);
  }
  void unmap() {
    for (char*& view : views) {
      if (view != nullptr) ::munmap(view, bytes);
      view = nullptr;
    }
  }
};

char* map_file(int fd, size_t bytes) {
  void* view = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return view == MAP_FAILED ? nullptr : static_cast<char*>(view);
}

}  // namespace

Tensor allocate_symmetric(Communicator& comm, const std::shared_ptr<SymmetricRegistry>& registry,
                          uint64_t id, const Shape& shape, DType dtype) {
  const int64_t numel = shape_numel(shape);
  const size_t bytes = static_cast<size_t>(numel) * dtype_size(dtype);
  const int rank = comm.rank(), size = comm.size();
  // Whole pages, so that every view is page-aligned and nothing else shares them.
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  auto maps = std::make_unique<Mappings>();
  maps->bytes = (bytes + page - 1) / page * page;
  maps->views.assign(static_cast<size_t>(size), nullptr);

  std::string failure;
  if (bytes == 0) {
    failure = "empty";  // nothing to map (every rank, or the size check below fails)
  } else if ((maps->fd = ::memfd_create("loom-symmetric", MFD_CLOEXEC)) < 0) {
    failure = str_cat("memfd_create: ", std::strerror(errno));
  } else if (::ftruncate(maps->fd, static_cast<off_t>(maps->bytes)) != 0) {
    failure = str_cat("ftruncate(", maps->bytes, " bytes): ", std::strerror(errno));
  } else if ((maps->views[static_cast<size_t>(rank)] = map_file(maps->fd, maps->bytes)) ==
             nullptr) {
    failure = str_cat("mmap(", maps->bytes, " bytes): ", std::strerror(errno));
  }

  // Everyone's (bytes, pid, fd); pid -1 where creating the file failed.
  const Tensor mine = Tensor::from_vector(
      std::vector<int64_t>{static_cast<int64_t>(bytes),
                           failure.empty() ? static_cast<int64_t>(::getpid()) : -1,
                           failure.empty() ? static_cast<int64_t>(maps->fd) : -1},
      {3});
  const Tensor all = Tensor::zeros({3 * static_cast<int64_t>(size)}, DType::i64);
  comm.all_gather(mine, all).wait();
  const std::vector<int64_t> ids = all.to_vector<int64_t>();
  // Every rank sees the same sizes, so every rank throws here or none does
  // (mapping a smaller file than this rank's size would fault on access).
  for (int r = 0; r < size; ++r) {
    LOOM_CHECK(ids[static_cast<size_t>(3 * r)] == ids[0], "allocate_symmetric on group '",
               comm.name(), "': rank 0 asks for ", ids[0], " bytes, rank ", r, " for ",
               ids[static_cast<size_t>(3 * r)],
               "; every rank must allocate the same shape and dtype, in the same order");
  }
  if (bytes == 0) return Tensor::zeros(shape, dtype);
  for (int r = 0; r < size && failure.empty(); ++r) {
    if (r == rank) continue;
    const int64_t pid = ids[static_cast<size_t>(3 * r + 1)];
    const int64_t fd = ids[static_cast<size_t>(3 * r + 2)];
    if (pid < 0) {
      failure = str_cat("rank ", r, " could not create its region");
      break;
    }
    const std::string path = str_cat("/proc/", pid, "/fd/", fd);
    const int peer_fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (peer_fd < 0) {
      failure = str_cat("open(", path, "): ", std::strerror(errno));
      break;
    }
    maps->views[static_cast<size_t>(r)] = map_file(peer_fd, maps->bytes);
    ::close(peer_fd);
    if (maps->views[static_cast<size_t>(r)] == nullptr) {
      failure = str_cat("mmap of rank ", r, "'s region: ", std::strerror(errno));
    }
  }

  // Every rank mapped everything? (Also the point after which no peer opens our file.)
  const Tensor ok = Tensor::from_vector(std::vector<int64_t>{failure.empty() ? 1 : 0}, {1});
  comm.all_reduce(ok, {.op = ReduceOp::min}).wait();
  if (maps->fd >= 0) ::close(maps->fd);
  maps->fd = -1;
  if (ok.to_vector<int64_t>()[0] == 0) {
    LOOM_LOG_DEBUG("group '", comm.name(), "': symmetric memory unavailable (",
                   failure.empty() ? std::string("a peer failed") : failure,
                   "); using ordinary memory");
    return Tensor::zeros(shape, dtype);
  }

  char* own = maps->views[static_cast<size_t>(rank)];
  registry->add(rank, SymmetricRegistry::Region{.id = id, .bytes = bytes, .bases = maps->views});
  // This rank's region is its memory, outside the host allocator (NOTE
  // [memory outside the allocator]); its peers' views are theirs.
  const auto own_bytes = static_cast<int64_t>(maps->bytes);
  allocator_for(Device::cpu()).add_external(own_bytes);
  return Tensor::from_blob(
      own, shape, dtype, Device::cpu(),
      [registry, own, own_bytes, maps = std::shared_ptr<Mappings>(std::move(maps))] {
        registry->remove(own);
        maps->unmap();
        allocator_for(Device::cpu()).add_external(-own_bytes);
      });
}

}  // namespace loom::comm::mpi
