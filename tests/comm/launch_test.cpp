// Launch detection (loom::detect_launch) and the launcher/MPI cross-check
// (loom::launch_mismatch): pure functions, tested over made-up environments.
#include <catch2/catch.hpp>

#include "loom/comm/context.hpp"

using Catch::Matchers::Contains;
using loom::detect_launch;
using loom::launch_mismatch;
using loom::LaunchInfo;
using Env = std::map<std::string, std::string>;
using L = LaunchInfo::Launcher;

namespace {
LaunchInfo mpi_view(int rank, int size, int local_rank, int local_size) {
  LaunchInfo info;
  info.rank = rank;
  info.world_size = size;
  info.local_rank = local_rank;
  info.local_size = local_size;
  return info;
}
}  // namespace

TEST_CASE("detect_launch: no launcher means one process") {
  const LaunchInfo info = detect_launch(Env{{"HOME", "/root"}});
  CHECK(info.launcher == L::none);
  CHECK(info.rank == 0);
  CHECK(info.world_size == 1);
  CHECK(info.local_rank == 0);
  CHECK(info.local_size == 1);
  CHECK(info.describe() == "rank 0 of 1, local rank 0 of 1, no launcher (one process)");
}

TEST_CASE("detect_launch: mpirun of Open MPI") {
  const LaunchInfo info =
      detect_launch(Env{{"OMPI_COMM_WORLD_RANK", "5"},
                        {"OMPI_COMM_WORLD_SIZE", "8"},
                        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                        {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                        // mpirun inside a Slurm allocation: the node's daemon was started by srun
                        {"SLURM_PROCID", "1"},
                        {"SLURM_NTASKS", "2"},
                        {"PMIX_RANK", "5"}});
  CHECK(info.launcher == L::open_mpi);
  CHECK(info.rank == 5);
  CHECK(info.world_size == 8);
  CHECK(info.local_rank == 1);
  CHECK(info.local_size == 4);
  CHECK(info.describe() == "rank 5 of 8, local rank 1 of 4, launched by mpirun (Open MPI)");
}

TEST_CASE("detect_launch: srun, with and without PMIx, and Slurm's task lists") {
  const Env env{{"SLURM_PROCID", "6"},  {"SLURM_LOCALID", "2"},
                {"SLURM_NTASKS", "8"},  {"SLURM_NODEID", "1"},
                {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"}};
  LaunchInfo info = detect_launch(env);
  CHECK(info.launcher == L::slurm);
  CHECK(info.rank == 6);
  CHECK(info.world_size == 8);
  CHECK(info.local_rank == 2);
  CHECK(info.local_size == 4);

  // srun --mpi=pmix also sets PMIX_RANK (equal to SLURM_PROCID): still srun.
  Env with_pmix = env;
  with_pmix.insert({"PMIX_RANK", "6"});
  CHECK(detect_launch(with_pmix).launcher == L::slurm);

  // The step's task count wins over the allocation's; uneven nodes.
  info = detect_launch(Env{{"SLURM_PROCID", "4"},
                           {"PMIX_RANK", "4"},
                           {"SLURM_LOCALID", "1"},
                           {"SLURM_NTASKS", "8"},
                           {"SLURM_STEP_NUM_TASKS", "5"},
                           {"SLURM_NODEID", "1"},
                           {"SLURM_STEP_TASKS_PER_NODE", "3,2"}});
  CHECK(info.world_size == 5);
  CHECK(info.local_size == 2);

  // Without a task list the node size is left to MPI.
  const LaunchInfo bare =
      detect_launch(Env{{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS", "4"}});
  CHECK(bare.world_size == 4);
  CHECK(bare.local_size == -1);
  CHECK(bare.describe() == "rank 0 of 4, local rank 0 of ?, launched by srun (Slurm)");
}

TEST_CASE("detect_launch: PMIx, MPICH's Hydra and torchrun-style variables") {
  const LaunchInfo pmix = detect_launch(Env{{"PMIX_RANK", "3"}});
  CHECK(pmix.launcher == L::pmix);
  CHECK(pmix.rank == 3);
  CHECK(pmix.world_size == -1);  // PMIx says only the rank; MPI fills in the rest

  const LaunchInfo hydra = detect_launch(Env{{"PMI_RANK", "2"},
                                             {"PMI_SIZE", "4"},
                                             {"MPI_LOCALRANKID", "0"},
                                             {"MPI_LOCALNRANKS", "2"},
                                             {"SLURM_PROCID", "1"}});  // Hydra's proxy, via srun
  CHECK(hydra.launcher == L::hydra);
  CHECK(hydra.rank == 2);
  CHECK(hydra.world_size == 4);
  CHECK(hydra.local_rank == 0);
  CHECK(hydra.local_size == 2);

  const LaunchInfo torch = detect_launch(
      Env{{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}});
  CHECK(torch.launcher == L::torchrun);
  CHECK(torch.rank == 3);
  CHECK(torch.world_size == 4);
  CHECK(torch.local_rank == 1);
  CHECK(torch.local_size == 2);
}

TEST_CASE("detect_launch: unreadable or inconsistent variables are rejected by name") {
  CHECK_THROWS_WITH(detect_launch(Env{{"OMPI_COMM_WORLD_RANK", "one"}}),
                    Contains("OMPI_COMM_WORLD_RANK='one' is not a non-negative integer"));
  CHECK_THROWS_WITH(detect_launch(Env{{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}),
                    Contains("srun (Slurm) reports rank 4 in a world of 4"));
  CHECK_THROWS_WITH(detect_launch(Env{{"SLURM_PROCID", "0"}, {"SLURM_TASKS_PER_NODE", "2(x"}}),
                    Contains("SLURM_TASKS_PER_NODE='2(x' is not a Slurm task list"));
}

TEST_CASE("launch_mismatch: agreement, and what to do when MPI sees another world") {
  const LaunchInfo srun = detect_launch(Env{{"SLURM_PROCID", "0"},
                                            {"SLURM_LOCALID", "0"},
                                            {"SLURM_NTASKS", "4"},
                                            {"SLURM_TASKS_PER_NODE", "4"}});
  CHECK(launch_mismatch(srun, mpi_view(0, 4, 0, 4)).empty());
  // The classic: srun without PMIx support, every process is rank 0 of 1.
  CHECK(launch_mismatch(srun, mpi_view(0, 1, 0, 1)) ==
        "srun started 4 tasks but MPI sees a world of 1: launch with `srun --mpi=pmix` "
        "(Debian's Open MPI speaks PMIx only; `srun --mpi=list` shows what this Slurm offers)");

  const LaunchInfo ompi = detect_launch(Env{{"OMPI_COMM_WORLD_RANK", "1"},
                                            {"OMPI_COMM_WORLD_SIZE", "2"},
                                            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  CHECK(launch_mismatch(ompi, mpi_view(1, 2, 1, 2)).empty());
  CHECK_THAT(launch_mismatch(ompi, mpi_view(0, 1, 0, 1)),
             Contains("mpirun started 2 processes but MPI sees a world of 1") &&
                 Contains("different MPI library"));
  CHECK_THAT(launch_mismatch(ompi, mpi_view(0, 2, 0, 2)),
             Contains("says this is rank 1 but MPI says rank 0"));
  CHECK_THAT(launch_mismatch(ompi, mpi_view(1, 2, 0, 1)),
             Contains("says local rank 1 of 2 but MPI's shared-memory communicator says local "
                      "rank 0 of 1"));

  const LaunchInfo torch = detect_launch(Env{{"RANK", "0"}, {"WORLD_SIZE", "4"}});
  CHECK_THAT(launch_mismatch(torch, mpi_view(0, 1, 0, 1)),
             Contains("needs an MPI launcher: `mpirun -np 4 <program>`"));

  // Unknown values (-1) are not compared: PMIx gives only the rank.
  CHECK(launch_mismatch(detect_launch(Env{{"PMIX_RANK", "3"}}), mpi_view(3, 6, 1, 2)).empty());
  CHECK(launch_mismatch(detect_launch(Env{}), mpi_view(0, 1, 0, 1)).empty());
}

TEST_CASE("launch_problem_before_mpi: srun without PMIx is named before MPI_Init") {
  const Env srun{{"SLURM_PROCID", "1"}, {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_LOCALID", "1"}};
  auto with = [&](std::initializer_list<Env::value_type> extra) {
    Env env = srun;
    for (const auto& entry : extra) env.insert_or_assign(entry.first, entry.second);
    return env;
  };
  CHECK_THAT(loom::launch_problem_before_mpi(with({{"PMI_RANK", "1"}, {"PMI_SIZE", "4"}}), true),
             Contains("srun started 4 tasks without PMIx (it speaks PMI-2 here)") &&
                 Contains("srun --mpi=pmix"));
  CHECK_THAT(loom::launch_problem_before_mpi(srun, true), Contains("without PMIx,"));
  CHECK(loom::launch_problem_before_mpi(srun, false).empty());  // an MPI that speaks PMI-2
  CHECK(loom::launch_problem_before_mpi(with({{"PMIX_RANK", "1"}}), true).empty());
  CHECK(loom::launch_problem_before_mpi(
            with({{"SLURM_STEP_NUM_TASKS", "1"}, {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}}),
            true)
            .empty());
  // A batch script running the program directly: no step, nothing to say.
  CHECK(loom::launch_problem_before_mpi(Env{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}}, true)
            .empty());
  CHECK(loom::launch_problem_before_mpi(Env{}, true).empty());
}
