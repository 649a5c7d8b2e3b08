#!/usr/bin/env python3
"""A parallel train_gpt or train_resnet run under mpirun against one rank.

  compare_train_runs.py [--accumulate] [--rtol R] MPIRUN NP PROGRAM --layout "ARGS" -- COMMON_ARGS...
  compare_train_runs.py --output FILE NP PROGRAM --layout "ARGS" -- COMMON_ARGS...

Runs PROGRAM COMMON_ARGS on one process with --batch multiplied by the
layout's data-parallel size dp = NP / (tp x pp) (--tp and --pp from ARGS, 1
when absent), then `MPIRUN -np NP PROGRAM COMMON_ARGS LAYOUT_ARGS`, and
compares every logged step's loss (printed to 4 decimals) and gradient norm,
and, where the runs print them, the validation loss, the test accuracy after
each epoch and the parameters' L2 and L1 norms: they must agree to within one
unit of the last printed digit plus 1e-4 relative (--rtol R: R relative).

--accumulate (train_resnet): the one-rank run also takes --micro-batches
dp x M, M the layout's --micro-batches (the pipeline's default: pp), so it
runs the same micro-batches one after another; BatchNorm normalises each
micro-batch by its own statistics, so the micro-batches must be the same.

Exit 0 when they agree; each run has a hard 240 s limit, so a hang fails.
With --output, the multi-rank run is one made elsewhere (the Slurm test's
job, tests/slurm/run_slurm_test.sh): FILE holds its output. --resumed: that
run resumed from a checkpoint, so it logged the last steps only: those are
compared (at least one, and the last).
"""
import re
import shlex
import subprocess
import sys

STEP = re.compile(r"^step\s+(\d+)\s+loss ([\d.]+)\s+lr \S+\s+norm ([\d.]+)")
# Optional lines, compared when the one-rank run prints them: pattern, and
# the unit of the last printed digit of each group.
OPTIONAL = {
    "validation loss": (re.compile(r"validation loss ([\d.]+) nats"), [1e-4]),
    "test accuracy": (re.compile(r"epoch (\d+)\s+test accuracy ([\d.]+)%"), [0, 0.1]),
    "parameter norms": (re.compile(r"parameters: L2 norm ([\d.]+)\s+L1 norm ([\d.]+)"),
                        [1e-6, 1e-4]),
}


def run(command):
    print("$ " + " ".join(command), flush=True)
    out = subprocess.run(command, capture_output=True, text=True, timeout=240)
    text = out.stdout + out.stderr
    if out.returncode != 0:
        print(text)
        # A run asked for a GPU the process cannot see (--device cuda:N on a
        # machine without one): the reason for ctest's skip (the CUDA cases'
        # SKIP_REGULAR_EXPRESSION) and for report_skips.py.
        absent = [line for line in text.splitlines() if "sees 0 CUDA device" in line]
        if absent:
            print("SKIPPED: " + absent[-1].strip())
        raise SystemExit(f"FAIL: exit status {out.returncode}")
    return parse(text)


def parse(text):
    steps = {}
    for m in map(STEP.match, text.splitlines()):
        if m:
            steps[int(m[1])] = (float(m[2]), float(m[3]))
    if not steps:
        print(text)
        raise SystemExit("FAIL: no step lines in the output")
    found = {name: [tuple(float(g) for g in m.groups()) for m in pattern.finditer(text)]
             for name, (pattern, _) in OPTIONAL.items()}
    return steps, found


RTOL = 1e-4


def close(a, b, digit):
    return abs(a - b) <= digit + RTOL * abs(b)


def flag(args, name, default):
    return int(args[args.index(name) + 1]) if name in args else default


def main():
    global RTOL
    argv = sys.argv[1:]
    output = None
    accumulate = resumed = False
    while argv[0] in ("--output", "--accumulate", "--rtol", "--resumed"):
        if argv[0] == "--output":  # FILE takes MPIRUN's place
            output, argv = argv[1], argv[1:]
        elif argv[0] == "--resumed":
            resumed, argv = True, argv[1:]
        elif argv[0] == "--rtol":
            RTOL, argv = float(argv[1]), argv[2:]
        else:
            accumulate, argv = True, argv[1:]
    mpirun, np, program = argv[0], int(argv[1]), argv[2]
    layout = shlex.split(argv[argv.index("--layout") + 1])
    common = argv[argv.index("--") + 1:]
    tp, pp = flag(layout, "--tp", 1), flag(layout, "--pp", 1)
    dp = np // (tp * pp)
    single_args = list(common)
    single_args[common.index("--batch") + 1] = str(flag(common, "--batch", 0) * dp)
    if accumulate:
        single_args += ["--micro-batches", str(flag(layout, "--micro-batches", pp) * dp)]
    want, want_extra = run([program, *single_args])
    if output is None:
        got, got_extra = run([mpirun, "-np", str(np), "--oversubscribe", program, *common,
                              *layout])
    else:
        print(f"{np} ranks: the output in {output}", flush=True)
        with open(output) as f:
            got, got_extra = parse(f.read())
    problems = []
    if resumed:
        if max(want) not in got:
            problems.append(f"the resumed run did not log the last step, {max(want)}")
        want = {step: values for step, values in want.items() if step in got}
    if sorted(want) != sorted(got):
        problems.append(f"logged steps differ: {sorted(want)} vs {sorted(got)}")
    for step in sorted(set(want) & set(got)):
        (wl, wn), (gl, gn) = want[step], got[step]
        print(f"step {step}: loss {gl} (one rank {wl}), norm {gn} (one rank {wn})")
        if not close(gl, wl, 1e-4) or not close(gn, wn, 1e-3):
            problems.append(f"step {step}: loss {gl} norm {gn}, one rank: loss {wl} norm {wn}")
    for name, (_, digits) in OPTIONAL.items():
        w, g = want_extra[name], got_extra[name]
        if not w:
            continue
        print(f"{name}: {g} (one rank {w})")
        if len(w) != len(g) or any(not close(gv, wv, d)
                                   for wr, gr in zip(w, g)
                                   for wv, gv, d in zip(wr, gr, digits)):
            problems.append(f"{name}: {g}, one rank {w}")
    for p in problems:
        print("FAIL: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
