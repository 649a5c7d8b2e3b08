// Launch detection: which launcher started this process, and what it says
// about ranks. Pure functions over an environment map (see context.hpp).
//
// NOTE [launcher precedence]
// Launchers nest: Open MPI's mpirun inside a Slurm allocation starts its
// daemons with srun, so its processes inherit SLURM_PROCID = the node index;
// MPICH's Hydra does the same. The variables of the innermost launcher win:
// Open MPI's, then PMI (Hydra) and PMIx, which srun also sets when it speaks
// that protocol (then SLURM_PROCID equals the PMI rank and we say "srun"),
// then Slurm alone, then torchrun-style RANK/WORLD_SIZE.
#include <cerrno>
#include <cstdlib>
#include <vector>

#include "loom/comm/context.hpp"

extern char** environ;

namespace loom {
namespace {

using Env = std::map<std::string, std::string>;

const std::string* find(const Env& env, const char* name) {
  const auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

int parse_int(const std::string& text, const char* name) {
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text.c_str(), &end, 10);
  LOOM_CHECK(end != text.c_str() && *end == '\0' && errno == 0 && value >= 0 && value < (1L << 30),
             "launcher variable ", name, "='", text, "' is not a non-negative integer");
  return static_cast<int>(value);
}

// The variable's value, or -1 when it is not set.
int get(const Env& env, const char* name) {
  const std::string* text = find(env, name);
  return text ? parse_int(*text, name) : -1;
}

// Slurm's task-per-node lists look like "2(x3),1": 2 tasks on each of 3 nodes, then 1.
int tasks_on_node(const std::string& text, int node, const char* name) {
  std::vector<int> per_node;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(pos, comma - pos);
    const size_t paren = item.find("(x");
    if (paren == std::string::npos) {
      per_node.push_back(parse_int(item, name));
    } else {
      LOOM_CHECK(item.back() == ')', "launcher variable ", name, "='", text,
                 "' is not a Slurm task list like 2(x3),1");
      const int tasks = parse_int(item.substr(0, paren), name);
      const int repeat = parse_int(item.substr(paren + 2, item.size() - paren - 3), name);
      per_node.insert(per_node.end(), static_cast<size_t>(repeat), tasks);
    }
    pos = comma + 1;
  }
  if (node < 0) return per_node.size() == 1 ? per_node[0] : -1;
  return static_cast<size_t>(node) < per_node.size() ? per_node[static_cast<size_t>(node)] : -1;
}

LaunchInfo make(LaunchInfo::Launcher launcher, int rank, int size, int local_rank, int local_size) {
  LaunchInfo info;
  info.launcher = launcher;
  info.rank = rank;
  info.world_size = size;
  info.local_rank = local_rank;
  info.local_size = local_size;
  return info;
}

LaunchInfo from_slurm(const Env& env) {
  int size = get(env, "SLURM_STEP_NUM_TASKS");
  if (size < 0) size = get(env, "SLURM_NTASKS");
  if (size < 0) size = get(env, "SLURM_NPROCS");
  int local_size = -1;
  const char* list_var =
      find(env, "SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
  if (const std::string* list = find(env, list_var)) {
    local_size = tasks_on_node(*list, get(env, "SLURM_NODEID"), list_var);
  }
  return make(LaunchInfo::Launcher::slurm, get(env, "SLURM_PROCID"), size,
              get(env, "SLURM_LOCALID"), local_size);
}

void validate(const LaunchInfo& info) {
  LOOM_CHECK(info.world_size != 0 && info.local_size != 0, "launcher ", info.launcher_name(),
             " reports a world of ", info.world_size, " and a node of ", info.local_size,
             " processes; both must be at least 1");
  LOOM_CHECK(info.world_size < 0 || info.rank < info.world_size, "launcher ", info.launcher_name(),
             " reports rank ", info.rank, " in a world of ", info.world_size);
  LOOM_CHECK(info.local_size < 0 || info.local_rank < info.local_size, "launcher ",
             info.launcher_name(), " reports local rank ", info.local_rank, " on a node of ",
             info.local_size);
}

}  // namespace

std::string LaunchInfo::launcher_name() const {
  switch (launcher) {
    case Launcher::none:
      return "none";
    case Launcher::open_mpi:
      return "mpirun (Open MPI)";
    case Launcher::slurm:
      return "srun (Slurm)";
    case Launcher::pmix:
      return "PMIx";
    case Launcher::hydra:
      return "mpiexec (MPICH/Hydra)";
    case Launcher::torchrun:
      return "torchrun";
  }
  return "?";
}

std::string LaunchInfo::describe() const {
  auto or_unknown = [](int v) { return v < 0 ? std::string("?") : std::to_string(v); };
  return str_cat("rank ", or_unknown(rank), " of ", or_unknown(world_size), ", local rank ",
                 or_unknown(local_rank), " of ", or_unknown(local_size),
                 launcher == Launcher::none ? std::string(", no launcher (one process)")
                                            : ", launched by " + launcher_name());
}

LaunchInfo detect_launch(const Env& env) {
  using L = LaunchInfo::Launcher;
  LaunchInfo info;  // none: one process
  const int slurm_rank = get(env, "SLURM_PROCID");
  if (find(env, "OMPI_COMM_WORLD_RANK")) {
    info = make(L::open_mpi, get(env, "OMPI_COMM_WORLD_RANK"), get(env, "OMPI_COMM_WORLD_SIZE"),
                get(env, "OMPI_COMM_WORLD_LOCAL_RANK"), get(env, "OMPI_COMM_WORLD_LOCAL_SIZE"));
  } else if (find(env, "PMI_RANK")) {
    const int rank = get(env, "PMI_RANK");
    info = slurm_rank == rank ? from_slurm(env)  // srun --mpi=pmi2
                              : make(L::hydra, rank, get(env, "PMI_SIZE"),
                                     get(env, "MPI_LOCALRANKID"), get(env, "MPI_LOCALNRANKS"));
  } else if (find(env, "PMIX_RANK")) {
    const int rank = get(env, "PMIX_RANK");
    info = slurm_rank == rank ? from_slurm(env)  // srun --mpi=pmix
                              : make(L::pmix, rank, -1, -1, -1);
  } else if (slurm_rank >= 0) {
    info = from_slurm(env);
  } else if (find(env, "RANK") && find(env, "WORLD_SIZE")) {
    info = make(L::torchrun, get(env, "RANK"), get(env, "WORLD_SIZE"), get(env, "LOCAL_RANK"),
                get(env, "LOCAL_WORLD_SIZE"));
  }
  validate(info);
  return info;
}

LaunchInfo detect_launch() {
  Env env;
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string text(*entry);
    const size_t eq = text.find('=');
    if (eq != std::string::npos) env.emplace(text.substr(0, eq), text.substr(eq + 1));
  }
  return detect_launch(env);
}

std::string launch_problem_before_mpi(const Env& env, bool mpi_needs_pmix) {
  // SLURM_STEP_NUM_TASKS: only tasks of an srun step have it (a batch script
  // running a program directly has SLURM_PROCID and SLURM_NTASKS too).
  if (!mpi_needs_pmix || !find(env, "SLURM_STEP_NUM_TASKS") || find(env, "PMIX_RANK") ||
      find(env, "OMPI_COMM_WORLD_RANK")) {
    return "";
  }
  const LaunchInfo launched = detect_launch(env);
  if (launched.launcher != LaunchInfo::Launcher::slurm || launched.world_size <= 1) return "";
  return str_cat("srun started ", launched.world_size, " tasks without PMIx",
                 find(env, "PMI_RANK") ? " (it speaks PMI-2 here)" : "",
                 ", and this Open MPI can only join a job through PMIx: launch with "
                 "`srun --mpi=pmix` (`srun --mpi=list` shows what this Slurm offers; "
                 "scripts/slurm/loom.sbatch does it for you)");
}

std::string launch_mismatch(const LaunchInfo& launched, const LaunchInfo& mpi) {
  using L = LaunchInfo::Launcher;
  const int n = launched.world_size;
  if (n >= 0 && n != mpi.world_size) {
    const std::string head = str_cat(" but MPI sees a world of ", mpi.world_size, ": ");
    switch (launched.launcher) {
      case L::slurm:
        return str_cat("srun started ", n, " tasks", head,
                       "launch with `srun --mpi=pmix` (Debian's Open MPI speaks PMIx only; "
                       "`srun --mpi=list` shows what this Slurm offers)");
      case L::open_mpi:
        return str_cat("mpirun started ", n, " processes", head,
                       "the program uses a different MPI library than the mpirun that started it "
                       "(compare `which mpirun` with `ldd <program> | grep libmpi`)");
      case L::hydra:
        return str_cat("mpiexec (MPICH/Hydra) started ", n, " processes", head,
                       "launch with the mpirun of the MPI library Loom was built with "
                       "(`ldd <program> | grep libmpi`)");
      case L::torchrun:
        return str_cat("RANK/WORLD_SIZE (torchrun-style) say ", n, " processes", head,
                       "Loom's mpi backend needs an MPI launcher: `mpirun -np ", n,
                       " <program>` or `srun --mpi=pmix -n ", n, " <program>`");
      case L::pmix:
      case L::none:
        break;
    }
    return str_cat(launched.launcher_name(), " reports ", n, " processes", head,
                   "launch with the mpirun of the MPI library Loom was built with");
  }
  if (launched.rank >= 0 && launched.rank != mpi.rank) {
    return str_cat(launched.launcher_name(), " says this is rank ", launched.rank,
                   " but MPI says rank ", mpi.rank,
                   ": the launcher's variables do not belong to this MPI job (were they "
                   "exported by hand, or inherited from an outer launcher?)");
  }
  if ((launched.local_rank >= 0 && launched.local_rank != mpi.local_rank) ||
      (launched.local_size >= 0 && launched.local_size != mpi.local_size)) {
    return str_cat(launched.launcher_name(), " says local rank ", launched.local_rank, " of ",
                   launched.local_size, " but MPI's shared-memory communicator says local rank ",
                   mpi.local_rank, " of ", mpi.local_size,
                   ": ranks would pick GPUs inconsistently; check that the launcher's node "
                   "layout matches the machines (e.g. one srun step per allocation)");
  }
  return "";
}

}  // namespace loom
