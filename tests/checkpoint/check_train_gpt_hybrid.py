#!/usr/bin/env python3
"""Checkpoints of a hybrid-sharded run (train_gpt --zero-shard-size).

  check_train_gpt_hybrid.py MPIRUN TRAIN_GPT LOOM_CKPT WORK_DIR -- COMMON_ARGS...

COMMON_ARGS must hold --steps 8, --batch B and --log-every 1.
1. dp 4 with ZeRO-2 sharded over groups of 2 (replicated twice) trains 8
   steps, saving every 4 steps; it logs what dp 4 with ZeRO-2 over all four
   ranks logs, to the printed digit.
2. Only the first replica writes the sharded state: ranks 2 and 3's files
   hold no tensors, `loom-ckpt verify` passes.
3. The step-8 checkpoint loses its manifest; --resume on the same layout logs
   steps 4-7 exactly as the uninterrupted run did, and the same validation
   loss; --resume on dp 2 with ZeRO-1 (batch 2B) and on one rank (batch 4B)
   to the printed digit.
4. A checkpoint of dp 2 with ZeRO-3 resumed as dp 4 with ZeRO-3 sharded over
   2: to the printed digit.
Each run has a hard 240 s limit.
"""
import json
import os
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from train_gpt_log import run, step_mismatches, with_batch  # noqa: E402


def tensors_in(path):
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return [k for k in header if k != "__metadata__"]


def main():
    argv = sys.argv[1:]
    mpirun, program, ckpt_tool, work = argv[0], argv[1], argv[2], argv[3]
    common = argv[argv.index("--") + 1:]
    os.makedirs(work, exist_ok=True)
    problems = []

    def mp(n):
        return [mpirun, "-np", str(n), "--oversubscribe", program]

    def compare(name, got, want, got_val, want_val, exact, steps):
        if sorted(got) != steps:
            problems.append(f"{name}: logged steps {sorted(got)}, expected {steps}")
        problems.extend(step_mismatches(name, got, want, exact))
        if got_val is None or (got_val != want_val if exact else
                               abs(float(got_val) - float(want_val))
                               > 1e-4 + 1e-4 * float(want_val)):
            problems.append(f"{name}: validation loss {got_val}, reference {want_val}")

    hybrid = ["--zero-stage", "2", "--zero-shard-size", "2"]
    ckpt = os.path.join(work, "hybrid")
    shutil.rmtree(ckpt, ignore_errors=True)
    text, whole, whole_val = run(mp(4) + common + hybrid + ["--checkpoint-dir", ckpt,
                                                           "--save-every", "4"])
    if "replicated 2 times (hybrid sharding)" not in text:
        problems.append("the hybrid run did not print its sharding")
    _, plain, plain_val = run(mp(4) + common + ["--zero-stage", "2"])
    compare("ZeRO-2 over groups of 2 against over 4", whole, plain, whole_val, plain_val,
            exact=False, steps=list(range(8)))

    step8 = os.path.join(ckpt, "step-00000008")
    for r in range(4):
        names = tensors_in(os.path.join(step8, f"rank-{r:05d}.safetensors"))
        print(f"rank {r}: {len(names)} tensors")
        if (len(names) == 0) != (r >= 2):
            problems.append(f"rank {r} wrote {len(names)} tensors; the first replica (ranks 0 "
                            f"and 1) writes the sharded state, the second nothing")
    verify = subprocess.run([ckpt_tool, "verify", step8], capture_output=True, text=True,
                            timeout=120)
    print(verify.stdout + verify.stderr)
    if verify.returncode != 0:
        problems.append(f"loom-ckpt verify {step8} failed")

    os.remove(os.path.join(step8, "manifest.json"))
    resume = ["--checkpoint-dir", ckpt, "--resume"]
    for name, command, exact in [
            ("same layout", mp(4) + common + hybrid + resume, True),
            ("dp 2, ZeRO-1", mp(2) + with_batch(common, 2) + ["--zero-stage", "1"] + resume,
             False),
            ("one rank", [program] + with_batch(common, 4) + resume, False)]:
        text, got, val = run(command)
        if "at step 4" not in text:
            problems.append(f"{name}: did not resume at step 4")
        compare(name, got, whole, val, whole_val, exact, steps=[4, 5, 6, 7])

    # Saved under dp 2 with ZeRO-3, resumed hybrid-sharded over dp 4.
    ckpt3 = os.path.join(work, "dp2_zero3")
    shutil.rmtree(ckpt3, ignore_errors=True)
    run(mp(2) + with_batch(common, 2) + ["--zero-stage", "3", "--checkpoint-dir", ckpt3,
                                         "--save-every", "4"])
    os.remove(os.path.join(ckpt3, "step-00000008", "manifest.json"))
    text, got, val = run(mp(4) + common + ["--zero-stage", "3", "--zero-shard-size", "2",
                                           "--checkpoint-dir", ckpt3, "--resume"])
    if "at step 4" not in text:
        problems.append("dp 2 ZeRO-3 into hybrid: did not resume at step 4")
    compare("dp 2 ZeRO-3 into dp 4 ZeRO-3 over groups of 2", got, whole, val, whole_val,
            exact=False, steps=[4, 5, 6, 7])

    for p in problems:
        print("FAIL: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
