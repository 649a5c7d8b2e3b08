// Uses each bundled dependency once; rank 0 prints one JSON line that the
// offline-build test checks.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <mpi.h>
#include <zlib.h>

#include <CLI/CLI.hpp>
#include <Eigen/Dense>
#include <cstdio>
#include <nlohmann/json.hpp>

int main(int argc, char** argv) {
  CLI::App app("bundle probe");
  int factor = 1;
  app.add_option("--factor", factor);
  CLI11_PARSE(app, argc, argv);

  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const Eigen::Matrix2d m = Eigen::Matrix2d::Identity() * (rank + 1) * factor;
  double trace = m.trace(), sum = 0.0;
  MPI_Allreduce(&trace, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  const char text[] = "loom";
  const unsigned long crc = crc32(0L, reinterpret_cast<const Bytef*>(text), 4);
  const bool catch_ok = Catch::Session().configData().showHelp == false;
  if (rank == 0) {
    std::printf("%s\n", nlohmann::json{{"ranks", size},
                                       {"sum", sum},
                                       {"crc", crc},
                                       {"catch", catch_ok}}
                            .dump()
                            .c_str());
  }
  MPI_Finalize();
  return 0;
}
