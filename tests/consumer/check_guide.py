#!/usr/bin/env python3
"""The getting-started guide's program, built against the installed package.

  check_guide.py GUIDE_MD SOURCE PROGRAM MPIRUN DIGITS_CSV WORK_DIR

1. The guide shows the program verbatim: the ```cpp block of GUIDE_MD that
   starts with the source's first line equals SOURCE.
2. PROGRAM on one rank (ZeRO stage 0), and under `MPIRUN -np 2` at ZeRO stages
   0, 1, 2 and 3, logs the same loss curve (every logged step's mean loss
   within 1e-5 relative, gradient norm within 1e-4 relative) and test
   accuracy, and writes its checkpoint.
Exit 0 when all hold; 77 (skipped) when the digits file is missing.
"""
import os
import re
import subprocess
import sys

STEP = re.compile(r"^step\s+(\d+)\s+loss ([\d.]+)\s+norm ([\d.]+)")
ACCURACY = re.compile(r"^test accuracy ([\d.]+)", re.M)


def code_block(markdown, first_line):
    for block in re.findall(r"```cpp\n(.*?)```", markdown, re.S):
        if block.startswith(first_line):
            return block
    return None


def run(command, cwd):
    print("$ " + " ".join(command), flush=True)
    out = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=cwd)
    text = out.stdout + out.stderr
    if out.returncode != 0:
        print(text)
        raise SystemExit(f"FAIL: exit status {out.returncode}")
    steps = {int(m[1]): (float(m[2]), float(m[3])) for m in map(STEP.match, text.splitlines()) if m}
    accuracy = ACCURACY.search(text)
    if not steps or not accuracy:
        print(text)
        raise SystemExit("FAIL: no step or accuracy lines")
    if not os.path.exists(os.path.join(cwd, "train_digits.safetensors")):
        raise SystemExit("FAIL: no checkpoint written")
    return steps, float(accuracy[1])


def main():
    guide, source, program, mpirun, digits, work = sys.argv[1:7]
    if not os.path.exists(digits):
        print(f"skipped: {digits} not found (scripts/fetch_digits.sh fetches it)")
        return 77
    text = open(source).read()
    block = code_block(open(guide).read(), text.splitlines()[0])
    if block != text:
        print(f"FAIL: {guide} does not show {source} verbatim; copy the file into its cpp block")
        return 1
    os.makedirs(work, exist_ok=True)
    want, want_accuracy = run([program, "0", digits], work)
    problems = []
    for stage in range(4):
        got, accuracy = run([mpirun, "-np", "2", "--oversubscribe", program, str(stage), digits],
                            work)
        for step in sorted(want):
            (wl, wn), (gl, gn) = want[step], got.get(step, (float("nan"),) * 2)
            if not (abs(gl - wl) <= 1e-5 * abs(wl) and abs(gn - wn) <= 1e-4 * abs(wn)):
                problems.append(f"stage {stage}, step {step}: loss {gl} norm {gn}; "
                                f"one rank: loss {wl} norm {wn}")
        if accuracy != want_accuracy:
            problems.append(f"stage {stage}: test accuracy {accuracy}, one rank {want_accuracy}")
        print(f"2 ranks, ZeRO stage {stage}: {len(want)} logged steps, last loss "
              f"{got[max(got)][0]} (one rank {want[max(want)][0]}), accuracy {accuracy}")
    for p in problems:
        print("FAIL: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
