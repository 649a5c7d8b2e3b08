#!/usr/bin/env python3
"""The getting-started guide's program, built against the installed package.

  check_guide.py GUIDE_MD SOURCE PROGRAM MPIRUN DIGITS_CSV WORK_DIR

1. The guide shows the program verbatim: the ```cpp block of GUIDE_MD that
   starts with the source's first line equals SOURCE.
2. PROGRAM on one rank (ZeRO stage 0), and under `MPIRUN -np 2` at ZeRO stages
   0, 1, 2 and 3 (saving a checkpoint every epoch), logs the same loss curve
   (every logged step's mean loss within 1e-5 relative, gradient norm within
   1e-4 relative) and test accuracy.
3. Resumed on one rank from the 2-rank ZeRO-1 run's checkpoints, the newest
   two made unusable (one deleted, one without its manifest, as a crash in
   the middle of a save leaves it), it starts from the epoch-2 checkpoint and
   logs the uninterrupted run's losses from there on.
Exit 0 when all hold; 77 (skipped) when the digits file is missing.
"""
import os
import re
import shutil
import subprocess
import sys

STEP = re.compile(r"^step\s+(\d+)\s+loss ([\d.]+)\s+norm ([\d.]+)")
ACCURACY = re.compile(r"^test accuracy ([\d.]+)", re.M)


def code_block(markdown, first_line):
    for block in re.findall(r"```cpp\n(.*?)```", markdown, re.S):
        if block.startswith(first_line):
            return block
    return None


def run(command, cwd, resumed_from=None):
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
    if resumed_from is not None and f"resumed from {resumed_from}" not in text:
        print(text)
        raise SystemExit(f"FAIL: the run did not say it resumed from {resumed_from}")
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
        checkpoints = os.path.join(work, f"checkpoints-stage{stage}")
        shutil.rmtree(checkpoints, ignore_errors=True)
        got, accuracy = run([mpirun, "-np", "2", "--oversubscribe", program, str(stage), digits,
                             checkpoints], work)
        for step in sorted(want):
            (wl, wn), (gl, gn) = want[step], got.get(step, (float("nan"),) * 2)
            if not (abs(gl - wl) <= 1e-5 * abs(wl) and abs(gn - wn) <= 1e-4 * abs(wn)):
                problems.append(f"stage {stage}, step {step}: loss {gl} norm {gn}; "
                                f"one rank: loss {wl} norm {wn}")
        if accuracy != want_accuracy:
            problems.append(f"stage {stage}: test accuracy {accuracy}, one rank {want_accuracy}")
        print(f"2 ranks, ZeRO stage {stage}: {len(want)} logged steps, last loss "
              f"{got[max(got)][0]} (one rank {want[max(want)][0]}), accuracy {accuracy}")
    # Resume on one rank from the 2-rank ZeRO-1 run's epoch-2 checkpoint.
    checkpoints = os.path.join(work, "checkpoints-stage1")
    shutil.rmtree(os.path.join(checkpoints, "step-00000100"))
    os.remove(os.path.join(checkpoints, "step-00000075", "manifest.json"))
    epoch2 = os.path.join(checkpoints, "step-00000050")
    got, accuracy = run([program, "0", digits, checkpoints], work, resumed_from=epoch2)
    if sorted(got) != [s for s in sorted(want) if s >= 50]:
        problems.append(f"resumed run logged steps {sorted(got)}, expected 50 onwards")
    for step in sorted(got):
        (wl, wn), (gl, gn) = want[step], got[step]
        if not (abs(gl - wl) <= 1e-5 * abs(wl) and abs(gn - wn) <= 1e-4 * abs(wn)):
            problems.append(f"resumed, step {step}: loss {gl} norm {gn}; "
                            f"uninterrupted: loss {wl} norm {wn}")
    if accuracy != want_accuracy:
        problems.append(f"resumed: test accuracy {accuracy}, uninterrupted {want_accuracy}")
    print(f"resumed on 1 rank from {epoch2}: steps {sorted(got)}, accuracy {accuracy}")
    for p in problems:
        print("FAIL: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
