"""What every PyTorch peer of Loom's benchmarks shares: one thread, bound to the
cores its Loom counterpart runs on, and a record of how it ran.

The peers run with the interpreter of the virtual environment that
`bash scripts/setup.sh --peers` makes (torch, numpy and safetensors from PyPI
at the versions in requirements.txt). The OpenMP, MKL and OpenBLAS thread
pools read OMP_NUM_THREADS, MKL_NUM_THREADS and OPENBLAS_NUM_THREADS once,
when torch is loaded, so setting them from Python after `import torch` has
no effect: the benchmarks set them before the interpreter starts, and `pin`
refuses to run without them.
"""
import os
import resource
import sys
import time

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def require_thread_environment(threads):
    """Exits unless every thread variable was set to `threads` before Python started."""
    wrong = [f"{name}={os.environ.get(name, '(unset)')}" for name in THREAD_VARIABLES
             if os.environ.get(name) != str(threads)]
    if wrong:
        wanted = " ".join(f"{name}={threads}" for name in THREAD_VARIABLES)
        sys.exit(f"peer: {', '.join(wrong)}: start Python with {wanted} "
                 "(the benchmarks do; torch reads them when it is loaded)")


def parse_cores(text):
    """'0/1' -> [{0}, {1}]: one set of cores per rank, ranks separated by '/',
    cores by ',' with ranges 'a-b'. An empty text binds nothing."""
    groups = []
    for group in filter(None, text.split("/")):
        cores = set()
        for part in group.split(","):
            first, _, last = part.partition("-")
            cores.update(range(int(first), int(last or first) + 1))
        groups.append(cores)
    return groups


def pin(threads, cores):
    """Binds every thread of this process to `cores` (a set, or None to leave
    the binding as it is) and torch to `threads` intra-op and inter-op threads;
    returns torch. Call it before the first torch operation: the inter-op pool
    can be sized only before it starts."""
    require_thread_environment(threads)
    if cores:
        # sched_setaffinity binds one thread; threads started later inherit
        # it, those already running (if importing torch started any) do not.
        for task in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(task), cores)
    import torch
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(threads)
    return torch


def rank_and_world():
    """This process's rank and the job's size from the launcher (mpirun, srun
    or torchrun); (0, 1) when started alone."""
    for rank, size in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                       ("PMI_RANK", "PMI_SIZE"), ("RANK", "WORLD_SIZE")):
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return 0, 1


def cpu_model():
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def torch_config(torch):
    """The first lines of torch.__config__.show(): compiler, BLAS, oneDNN,
    OpenMP, CPU capability (the long build-settings line is left out)."""
    lines = []
    for line in torch.__config__.show().splitlines()[1:]:
        line = line.strip().lstrip("- ").strip()
        if line.startswith("Build settings"):
            break
        if line:
            lines.append(line)
    return lines


def facts(torch):
    """The record every peer result carries, for this process."""
    return {"peer_torch_version": torch.__version__,
            "peer_config": torch_config(torch),
            "cpu_model": cpu_model(),
            "peer_threads": [torch.get_num_threads(), torch.get_num_interop_threads()],
            "peer_environment": {name: os.environ.get(name) for name in THREAD_VARIABLES}}


def binding():
    return sorted(os.sched_getaffinity(0))


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux counts KiB


class CpuShare:
    """CPU time of the whole process (every thread, user + system, as
    getrusage counts it) over the wall time of the spans measured: 1.0 is one
    core kept busy."""

    def __init__(self):
        self.cpu = self.wall = 0.0

    def __enter__(self):
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self._cpu = usage.ru_utime + usage.ru_stime
        self._wall = time.perf_counter()
        return self

    def __exit__(self, *exc):
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.cpu += usage.ru_utime + usage.ru_stime - self._cpu
        self.wall += time.perf_counter() - self._wall

    def share(self):
        return self.cpu / self.wall if self.wall > 0 else 0.0


def median(values):
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return -1.0
    return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])
