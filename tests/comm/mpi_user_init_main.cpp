// loom_mpi_user_init MODE: a program that starts MPI itself before loom::init().
//
//   multiple  MPI_Init_thread(MPI_THREAD_MULTIPLE): init() adopts it, the world
//             communicator works, ~Context leaves MPI running (the program's
//             own MPI_Barrier still works) and the program finalizes it.
//   single    MPI_Init (MPI_THREAD_SINGLE): init() refuses with a clear error.
// Exits 0 when Loom behaved as described.
#include <mpi.h>

#include <cstdio>
#include <string>

#include "loom/comm/context.hpp"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "multiple";
  int provided = 0;
  MPI_Init_thread(&argc, &argv, mode == "single" ? MPI_THREAD_SINGLE : MPI_THREAD_MULTIPLE,
                  &provided);
  int status = 0;
  if (mode == "single") {
    try {
      loom::Context context = loom::init();
      std::fprintf(stderr, "FAIL: loom::init() accepted MPI_THREAD_SINGLE\n");
      status = 1;
    } catch (const loom::Error& e) {
      const std::string what = e.what();
      std::fprintf(stderr, "loom::init() refused: %s\n", what.c_str());
      if (what.find("needs MPI_THREAD_MULTIPLE") == std::string::npos) status = 1;
    }
  } else {
    {
      loom::Context context = loom::init();
      if (context.owns_mpi()) status = 1;
      const loom::Tensor t = loom::Tensor::full({4}, 1.0);
      context.world()->all_reduce(t).wait();
      if (t.to_vector<float>()[3] != static_cast<float>(context.world_size())) status = 1;
    }
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (finalized || MPI_Barrier(MPI_COMM_WORLD) != MPI_SUCCESS) status = 1;
  }
  MPI_Finalize();
  if (status != 0) std::fprintf(stderr, "FAIL (%s)\n", mode.c_str());
  return status;
}
