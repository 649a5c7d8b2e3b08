#!/usr/bin/env python3
"""A tensor- or pipeline-parallel train_gpt run under mpirun against one rank.

  compare_train_gpt.py MPIRUN NP TRAIN_GPT --layout "ARGS" -- COMMON_ARGS...
  compare_train_gpt.py --output FILE NP TRAIN_GPT --layout "ARGS" -- COMMON_ARGS...

Runs TRAIN_GPT COMMON_ARGS on one process with --batch multiplied by the
layout's data-parallel size (NP / (tp x pp), --tp and --pp from ARGS, 1 when
absent), then `MPIRUN -np NP TRAIN_GPT
COMMON_ARGS LAYOUT_ARGS`, and compares every logged step's loss (printed to 4
decimals) and gradient norm (3 decimals) and the final validation loss: they
must agree to within one unit of the last printed digit plus 1e-4 relative.
Exit 0 when they do; each run has a hard 240 s limit, so a hang fails.
With --output, the multi-rank run is one made elsewhere (the Slurm test's
job, tests/slurm/run_slurm_test.sh): FILE holds its output.
"""
import re
import shlex
import subprocess
import sys

STEP = re.compile(r"^step\s+(\d+)\s+loss ([\d.]+)\s+lr \S+\s+norm ([\d.]+)")
VALIDATION = re.compile(r"validation loss ([\d.]+) nats")


def run(command):
    print("$ " + " ".join(command), flush=True)
    out = subprocess.run(command, capture_output=True, text=True, timeout=240)
    text = out.stdout + out.stderr
    if out.returncode != 0:
        print(text)
        raise SystemExit(f"FAIL: exit status {out.returncode}")
    return parse(text)


def parse(text):
    steps = {int(m[1]): (float(m[2]), float(m[3])) for m in map(STEP.match, text.splitlines()) if m}
    validation = [float(v) for v in VALIDATION.findall(text)]
    if not steps or not validation:
        print(text)
        raise SystemExit("FAIL: no step or validation lines in the output")
    return steps, validation[-1]


def close(a, b, digit):
    return abs(a - b) <= digit + 1e-4 * abs(b)


def main():
    argv = sys.argv[1:]
    output = None
    if argv[0] == "--output":  # FILE takes MPIRUN's place
        output, argv = argv[1], argv[1:]
    mpirun, np, program = argv[0], int(argv[1]), argv[2]
    layout = shlex.split(argv[argv.index("--layout") + 1])
    common = argv[argv.index("--") + 1:]
    tp = int(layout[layout.index("--tp") + 1]) if "--tp" in layout else 1
    pp = int(layout[layout.index("--pp") + 1]) if "--pp" in layout else 1
    batch = int(common[common.index("--batch") + 1])
    single_args = list(common)
    single_args[common.index("--batch") + 1] = str(batch * (np // (tp * pp)))
    want, want_val = run([program, *single_args])
    if output is None:
        got, got_val = run([mpirun, "-np", str(np), "--oversubscribe", program, *common, *layout])
    else:
        print(f"{np} ranks: the output in {output}", flush=True)
        with open(output) as f:
            got, got_val = parse(f.read())
    problems = []
    if sorted(want) != sorted(got):
        problems.append(f"logged steps differ: {sorted(want)} vs {sorted(got)}")
    for step in sorted(set(want) & set(got)):
        (wl, wn), (gl, gn) = want[step], got[step]
        print(f"step {step}: loss {gl} (one rank {wl}), norm {gn} (one rank {wn})")
        if not close(gl, wl, 1e-4) or not close(gn, wn, 1e-3):
            problems.append(f"step {step}: loss {gl} norm {gn}, one rank: loss {wl} norm {wn}")
    print(f"validation loss {got_val} (one rank {want_val})")
    if not close(got_val, want_val, 1e-4):
        problems.append(f"validation loss {got_val}, one rank {want_val}")
    for p in problems:
        print("FAIL: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
