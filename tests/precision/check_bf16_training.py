#!/usr/bin/env python3
"""A bf16 GPT trains as well as the fp32 one (issue 17's training-quality check).

  check_bf16_training.py TRAIN_GPT TOLERANCE -- ARGS...

Runs `TRAIN_GPT --precision fp32 ARGS` and `--precision bf16 ARGS` (ARGS hold
--steps, the model and the token file) and compares the final validation
losses: |bf16 - fp32| <= TOLERANCE nats. Also requires the bf16 run to have
actually rounded (some logged loss or norm differs from fp32's), so a bf16
flag that did nothing cannot pass, and both runs to have learned (validation
loss below the unigram baseline).
"""
import re
import subprocess
import sys


def run(train_gpt, precision, args):
    out = subprocess.run([train_gpt, "--precision", precision, *args],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=600)
    if out.returncode != 0:
        sys.exit(f"FAIL: train_gpt --precision {precision} exited {out.returncode}:\n{out.stdout}")
    steps = re.findall(r"^step +\d+ +loss (\S+) .* norm (\S+)", out.stdout, re.M)
    final = re.findall(r"validation loss (\S+) nats .*unigram baseline (\S+)\)", out.stdout)
    if not steps or not final:
        sys.exit(f"FAIL: no losses in the output of --precision {precision}:\n{out.stdout}")
    return steps, float(final[-1][0]), float(final[-1][1])


def main():
    train_gpt, tolerance = sys.argv[1], float(sys.argv[2])
    args = sys.argv[sys.argv.index("--") + 1:]
    fp32_steps, fp32_val, unigram = run(train_gpt, "fp32", args)
    bf16_steps, bf16_val, _ = run(train_gpt, "bf16", args)
    print(f"validation loss: fp32 {fp32_val:.4f}, bf16 {bf16_val:.4f} nats "
          f"(difference {bf16_val - fp32_val:+.4f}, tolerance {tolerance}); unigram {unigram:.3f}")
    if fp32_steps == bf16_steps:
        sys.exit("FAIL: the bf16 run logged exactly the fp32 run's losses and norms: "
                 "--precision bf16 did not round anything")
    for name, val in (("fp32", fp32_val), ("bf16", bf16_val)):
        if not val < unigram:
            sys.exit(f"FAIL: the {name} run did not learn (validation {val} >= unigram {unigram})")
    if abs(bf16_val - fp32_val) > tolerance:
        sys.exit(f"FAIL: bf16's validation loss is {abs(bf16_val - fp32_val):.4f} nats from "
                 f"fp32's (tolerance {tolerance})")
    print("PASS")


if __name__ == "__main__":
    main()
