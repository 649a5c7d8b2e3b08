#!/usr/bin/env python3
"""One command line, any launch size: --global-batch and --resume.

  check_global_batch_resume.py MPIRUN TRAIN_GPT WORK_DIR -- COMMON_ARGS...

COMMON_ARGS: a small GPT with --steps 8 and --log-every 1, no --batch.
1. 4 ranks (dp 4) train with --global-batch 8, saving every 4 steps.
2. The step-8 checkpoint loses its manifest (a crash before it was
   complete); the same command with --resume on 2 ranks (dp 2, each taking 4
   rows) and on one rank (8 rows) continues from step 4 and logs steps 4-7
   as the uninterrupted run did, to the printed digit.
3. 3 ranks are refused: 8 is not divisible by dp 3, naming both.
Each run has a hard 240 s limit.
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from train_gpt_log import run, step_mismatches  # noqa: E402


def main():
    argv = sys.argv[1:]
    mpirun, program, work = argv[0], argv[1], argv[2]
    ckpt = os.path.join(work, "checkpoints")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    common = argv[argv.index("--") + 1:] + ["--global-batch", "8", "--checkpoint-dir", ckpt]

    def mp(n):
        return [mpirun, "-np", str(n), "--oversubscribe", program]

    problems = []
    _, whole, _ = run(mp(4) + common + ["--save-every", "4"])
    if sorted(whole) != list(range(8)):
        problems.append(f"the uninterrupted run logged steps {sorted(whole)}")
    os.remove(os.path.join(ckpt, "step-00000008", "manifest.json"))
    for name, launch in (("2 ranks", mp(2)), ("one rank", [program])):
        text, got, _ = run(launch + common + ["--resume"])
        if "step-00000004 at step 4" not in text:
            problems.append(f"{name}: did not resume from step-00000004 at step 4")
        if sorted(got) != [4, 5, 6, 7]:
            problems.append(f"{name}: logged steps {sorted(got)}, expected 4-7")
        problems.extend(step_mismatches(name, got, whole, exact=False))
    text, _, _ = run(mp(3) + common + ["--resume"], expect_ok=False)
    if "--global-batch 8 is not divisible by the 3 data-parallel replicas" not in text:
        problems.append("3 ranks were not refused naming --global-batch 8 and dp 3")
    if problems:
        print("FAIL:\n  " + "\n  ".join(problems))
        return 1
    print("PASS: saved by 4 ranks, resumed by 2 and by 1 with the same flags")
    return 0


if __name__ == "__main__":
    sys.exit(main())
