#!/usr/bin/env python3
"""Runs a two-rank job with each of Loom's environment variables set to a value
it does not take; each run must end non-zero within seconds, naming the
variable and the value.

  check_env.py MPIEXEC PROGRAM [ARGS...]

PROGRAM ARGS is a short data-parallel run (it reaches loom::init, an
all-reduce and the allocator, where the variables are read). LOOM_LOG_LEVEL is
not here: the logger never throws, it says that it ignores the value (checked
too, on its own).
"""
import os
import subprocess
import sys
import time

BAD = {
    "LOOM_COMM_TIMEOUT": "soon",
    "LOOM_COMM_STALL_WARNING": "soon",
    "LOOM_COMM_BACKEND": "gloo",
    "LOOM_DEBUG_COLLECTIVES": "maybe",
    "LOOM_FLIGHT_RECORDER_SIZE": "-1",
    "LOOM_HOST_CACHE_MB": "-5",
    "LOOM_MPI_ALLREDUCE_CHUNK": "0",
    "LOOM_MPI_POLL_MAX_US": "5",
    "LOOM_MPI_PROGRESS": "spin",
    "LOOM_MPI_PROGRESS_SLICE_US": "-3",
    "LOOM_PROFILE": "maybe",
    "LOOM_SHM_ALLREDUCE": "sometimes",
    "LOOM_SYMMETRIC_MEMORY": "maybe",
}


def run(mpiexec, command, extra_env):
    env = dict(os.environ, **extra_env)
    start = time.monotonic()
    try:
        done = subprocess.run([mpiexec, "-np", "2", "--oversubscribe", *command], env=env,
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None, "", 60.0
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    mpiexec, command = sys.argv[1], sys.argv[2:]
    problems = []
    for name, value in BAD.items():
        status, out, seconds = run(mpiexec, command, {name: value})
        if status is None:
            problems.append(f"{name}={value}: the job still ran after 60 s")
        elif status == 0:
            problems.append(f"{name}={value}: accepted (exit 0)")
        elif f"{name}='{value}'" not in out:
            problems.append(f"{name}={value}: refused (exit {status}) without naming the "
                            f"variable and its value: {out.strip()[-300:]!r}")
        else:
            line = next(l for l in out.splitlines() if f"{name}='{value}'" in l)
            print(f"ok: {name}={value} ({seconds:.1f} s): {line.strip()[:160]}")
    status, out, _ = run(mpiexec, command, {"LOOM_LOG_LEVEL": "loud"})
    if "ignoring LOOM_LOG_LEVEL" not in out or "'loud'" not in out:
        problems.append(f"LOOM_LOG_LEVEL=loud: no warning naming the value: {out[-300:]!r}")
    else:
        print("ok: LOOM_LOG_LEVEL=loud: warned and ignored")
    for p in problems:
        print("FAIL: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
