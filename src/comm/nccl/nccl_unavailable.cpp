// make_nccl_communicator in a build without NCCL.
#include "loom/comm/nccl.hpp"

namespace loom::comm {

std::shared_ptr<Communicator> make_nccl_communicator(const std::shared_ptr<Communicator>&, Device,
                                                     const std::string&) {
  throw Error(
      "the nccl backend is not available: Loom was built without NCCL (LOOM_WITH_NCCL=OFF, or no "
      "CUDA toolkit / NCCL at build time); use the mpi backend");
}

}  // namespace loom::comm
