#!/usr/bin/env python3
"""The same run twice gives the same bits: train_gpt under several layouts,
each run twice, saving a checkpoint at its last step; the two checkpoints
(every rank's file and the manifest) must be equal byte for byte, and so
must the losses and norms they logged.

  check_bitwise_runs.py MPIRUN TRAIN_GPT WORK_DIR -- COMMON_ARGS...

COMMON_ARGS must hold --steps 6 and no --layers (each case has its own). Each run has a hard 240 s limit.
"""
import filecmp
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from train_gpt_log import run  # noqa: E402

# ranks, flags: dropout, every parallel dimension, ZeRO and hybrid sharding,
# the pipeline's split backward, bf16 products with bf16 gradient reduction.
CASES = [
    (1, "--layers 2 --dropout 0.1"),
    (4, "--layers 2 --tp 2 --sequence-parallel --zero-stage 1 --dropout 0.1"),
    (2, "--layers 4 --pp 2 --schedule zb-v --micro-batches 4"),
    (4, "--layers 2 --zero-stage 3 --zero-shard-size 2"),
    (2, "--layers 2 --zero-stage 2 --precision bf16 --grad-reduce bf16"),
]


def main():
    argv = sys.argv[1:]
    mpirun, program, work = argv[0], argv[1], argv[2]
    common = argv[argv.index("--") + 1:]
    problems = []
    for i, (ranks, flags) in enumerate(CASES):
        logs = []
        for attempt in ("a", "b"):
            ckpt = os.path.join(work, f"case{i}", attempt)
            shutil.rmtree(ckpt, ignore_errors=True)
            command = ([mpirun, "-np", str(ranks), "--oversubscribe"] if ranks > 1 else [])
            command += [program] + common + flags.split() + ["--checkpoint-dir", ckpt,
                                                             "--save-every", "6"]
            _, steps, val = run(command)
            logs.append((steps, val))
        a, b = (os.path.join(work, f"case{i}", x, "step-00000006") for x in ("a", "b"))
        names = sorted(os.listdir(a))
        if names != sorted(os.listdir(b)) or "manifest.json" not in names:
            problems.append(f"{flags}: the checkpoints hold {names} and {sorted(os.listdir(b))}")
            continue
        differ = [n for n in names if not filecmp.cmp(os.path.join(a, n), os.path.join(b, n),
                                                      shallow=False)]
        print(f"{ranks} rank(s) {flags}: {len(names)} files, {len(differ)} differ")
        if differ:
            problems.append(f"{ranks} rank(s) {flags}: {differ} differ between two runs")
        if logs[0] != logs[1] or not logs[0][0]:
            problems.append(f"{ranks} rank(s) {flags}: the logs differ: {logs[0]} / {logs[1]}")
    for p in problems:
        print("FAIL: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
