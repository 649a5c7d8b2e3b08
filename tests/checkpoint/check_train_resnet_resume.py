#!/usr/bin/env python3
"""train_resnet saves distributed checkpoints, BatchNorm's running statistics
included, and resumes from them.

  check_train_resnet_resume.py MPIRUN TRAIN_RESNET WORK_DIR -- COMMON_ARGS...

COMMON_ARGS train on the digits for 2 epochs with --batch B and --log-every 1.
1. dp 2 with ZeRO-1 trains, saving every 30 steps (one checkpoint, in the
   second epoch) and every epoch's end is evaluated on the test set with the
   running statistics.
2. --resume on the same layout logs the remaining steps, the test accuracy
   and the parameters' norms exactly as the uninterrupted run did (the
   accuracy needs the running statistics: without them it differs).
3. --resume on pp 2 (1F1B, 2 micro-batches of B) and on one rank (2
   micro-batches of B, one after another: each BatchNorm normalises B images
   as each dp rank did) logs the same losses and norms to the printed digit.
4. --resume with another --seed is refused naming both seeds.
Each run has a hard 240 s limit.
"""
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from train_gpt_log import run, step_mismatches, with_batch  # noqa: E402

ACCURACY = re.compile(r"^epoch (\d+)  test accuracy ([\d.]+)%", re.M)
NORMS = re.compile(r"^parameters: L2 norm ([\d.]+)  L1 norm ([\d.]+)", re.M)


def main():
    argv = sys.argv[1:]
    mpirun, program, work = argv[0], argv[1], argv[2]
    common = argv[argv.index("--") + 1:]
    ckpt = os.path.join(work, "checkpoints")
    shutil.rmtree(ckpt, ignore_errors=True)
    os.makedirs(work, exist_ok=True)
    problems = []

    def mp(n):
        return [mpirun, "-np", str(n), "--oversubscribe", program]

    text, whole, _ = run(mp(2) + common + ["--zero-stage", "1", "--checkpoint-dir", ckpt,
                                           "--save-every", "30"])
    whole_accuracy = ACCURACY.findall(text)
    whole_norms = NORMS.findall(text)
    saved = sorted(os.listdir(ckpt)) if os.path.isdir(ckpt) else []
    print(f"checkpoints: {saved}; accuracy {whole_accuracy}; norms {whole_norms}")
    if saved != ["step-00000030"] or not whole_accuracy or not whole_norms:
        problems.append(f"the first run saved {saved}, logged accuracy {whole_accuracy} and "
                        f"norms {whole_norms}")
        for p in problems:
            print("FAIL: " + p)
        return 1
    last = max(whole)
    resume = ["--checkpoint-dir", ckpt, "--resume"]

    def check(name, command, exact):
        text, got, _ = run(command)
        if "resumed from" not in text or "at step 30" not in text:
            problems.append(f"{name}: did not resume at step 30")
        if sorted(got) != list(range(30, last + 1)):
            problems.append(f"{name}: logged steps {sorted(got)}, expected 30-{last}")
        problems.extend(step_mismatches(name, got, whole, exact))
        accuracy = ACCURACY.findall(text)
        norms = NORMS.findall(text)
        print(f"{name}: accuracy {accuracy}, norms {norms}")
        if exact and (accuracy != whole_accuracy[-len(accuracy):] or not accuracy
                      or norms != whole_norms):
            problems.append(f"{name}: accuracy {accuracy} and norms {norms}, uninterrupted "
                            f"{whole_accuracy} and {whole_norms}")
        if not exact and norms:
            (l2, _), (wl2, _) = norms[-1], whole_norms[-1]
            if abs(float(l2) - float(wl2)) > 1e-4 * float(wl2):
                problems.append(f"{name}: parameters' L2 norm {l2}, uninterrupted {wl2}")

    check("same layout", mp(2) + common + ["--zero-stage", "1"] + resume, exact=True)
    check("pp 2", mp(2) + with_batch(common, 2)
          + ["--pp", "2", "--schedule", "1f1b", "--micro-batches", "2"] + resume, exact=False)
    check("one rank", [program] + with_batch(common, 2) + ["--micro-batches", "2"] + resume,
          exact=False)
    text, _, _ = run([program] + with_batch(common, 2) + ["--micro-batches", "2", "--seed", "2"]
                     + resume, expect_ok=False)
    if "was saved with seed 1, this run has 2" not in text:
        problems.append("a resume with another --seed was not refused naming both seeds")
    for p in problems:
        print("FAIL: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
