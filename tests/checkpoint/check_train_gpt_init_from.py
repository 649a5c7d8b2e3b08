#!/usr/bin/env python3
"""train_gpt --init-from: a consolidated checkpoint's weights start a run under any layout.

  check_train_gpt_init_from.py MPIRUN TRAIN_GPT LOOM_CKPT WORK_DIR -- COMMON_ARGS...

COMMON_ARGS must hold --batch B and --log-every 1 (and no --steps).
1. One rank trains 2 steps and saves a checkpoint; `loom-ckpt consolidate
   --gpt2` writes its weights as one file in GPT-2's layout, and config.json
   with the run's sizes.
2. One rank (batch 2B) starts 3 steps from the file: its first loss differs
   from a run that starts from its own initialisation (the weights came in).
3. tp 2 x dp 2 with ZeRO-1 (4 ranks, batch B each), and pp 2 with 1F1B over
   2 micro-batches (batch 2B), start from the file and log the same losses
   and norms as step 2's one rank within 1e-4 (relative) and 1e-4.
4. With --resume and a checkpoint in --checkpoint-dir, the checkpoint wins:
   the run says it resumed and not that it loaded the file.
5. Weights of another model (--d-model changed) are refused naming the
   tensor, before training.
Each run has a hard 240 s limit.
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from train_gpt_log import run, with_batch  # noqa: E402


def main():
    argv = sys.argv[1:]
    mpirun, program, tool, work = argv[:4]
    common = argv[argv.index("--") + 1:]
    ckpt = os.path.join(work, "checkpoints")
    weights = os.path.join(work, "gpt2.safetensors")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    one = [program] + with_batch(common, 2)
    run(one + ["--steps", "2", "--checkpoint-dir", ckpt, "--save-every", "2"])
    run([tool, "consolidate", ckpt, weights, "--gpt2"])

    problems = []
    # train_gpt records the model's sizes: Hugging Face's config.json beside the weights.
    with open(os.path.join(work, "config.json")) as f:
        config = json.load(f)
    for key, value in [("n_layer", 2), ("n_embd", 64), ("n_head", 4), ("n_positions", 32),
                       ("activation_function", "gelu_new")]:
        if config.get(key) != value:
            problems.append(f"config.json has {key} {config.get(key)!r}, the run {value!r}")
    init = ["--steps", "3", "--init-from", weights]
    text, reference, _ = run(one + init)
    if "initial weights from" not in text or "GPT-2's Conv1D layout" not in text:
        problems.append("one rank did not say it loaded the weights in GPT-2's layout")
    _, fresh, _ = run(one + ["--steps", "1"])
    if sorted(reference) != [0, 1, 2]:
        problems.append(f"one rank logged steps {sorted(reference)}")
    elif reference[0][0] == fresh[0][0]:
        problems.append(f"the first loss from the file equals a fresh model's ({fresh[0][0]})")

    def same(name, command):
        _, got, _ = run(command)
        if sorted(got) != [0, 1, 2]:
            problems.append(f"{name}: logged steps {sorted(got)}")
        for s in sorted(set(got) & set(reference)):
            (gl, gn), (wl, wn) = got[s], reference[s]
            print(f"{name}, step {s}: loss {gl} norm {gn} (one rank {wl} {wn})")
            if not (abs(float(gl) - float(wl)) <= 1e-4 + 1e-4 * float(wl)
                    and abs(float(gn) - float(wn)) <= 1e-4 + 1e-4 * float(wn)):
                problems.append(f"{name}, step {s}: loss {gl} norm {gn}, one rank {wl} {wn}")

    mp = lambda n: [mpirun, "-np", str(n), "--oversubscribe", program]  # noqa: E731
    same("tp 2 x dp 2, ZeRO-1", mp(4) + common + init + ["--tp", "2", "--zero-stage", "1"])
    same("pp 2, 1F1B", mp(2) + with_batch(common, 2) + init
         + ["--pp", "2", "--schedule", "1f1b", "--micro-batches", "2"])

    # (--steps as the checkpoint was saved with: a resumed run continues that run.)
    text, _, _ = run(one + ["--steps", "2", "--init-from", weights, "--checkpoint-dir", ckpt,
                         "--resume"])
    if "resumed from" not in text or "initial weights from" in text:
        problems.append("with a checkpoint to resume from, --init-from was not left aside")

    other = list(common)
    i = other.index("--d-model") + 1
    other[i] = str(2 * int(other[i]))
    text, _, _ = run([program] + with_batch(other, 2) + init, expect_ok=False)
    if "gpt2.safetensors" not in text or "wte.weight" not in text or "needs" not in text:
        problems.append("weights of another model were not refused naming the file and tensor")
    for p in problems:
        print("FAIL: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
