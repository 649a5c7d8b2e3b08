#!/usr/bin/env python3
"""A bf16 (or fp16) GPT trains as well as the fp32 one (issue 17's training-quality check).

  check_training.py TRAIN_GPT PRECISION TOLERANCE -- ARGS...

Runs `TRAIN_GPT --precision fp32 ARGS` and `--precision PRECISION ARGS` (ARGS
hold --steps, the model and the token file) and compares the final
validation losses: |reduced - fp32| <= TOLERANCE nats. Also requires the
reduced run to have actually rounded (some logged loss or norm differs from
fp32's), so a flag that did nothing cannot pass, and both runs to have
learned (validation loss below the unigram baseline).
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
    train_gpt, precision, tolerance = sys.argv[1], sys.argv[2], float(sys.argv[3])
    args = sys.argv[sys.argv.index("--") + 1:]
    fp32_steps, fp32_val, unigram = run(train_gpt, "fp32", args)
    low_steps, low_val, _ = run(train_gpt, precision, args)
    print(f"validation loss: fp32 {fp32_val:.4f}, {precision} {low_val:.4f} nats "
          f"(difference {low_val - fp32_val:+.4f}, tolerance {tolerance}); unigram {unigram:.3f}")
    if fp32_steps == low_steps:
        sys.exit(f"FAIL: the {precision} run logged exactly the fp32 run's losses and norms: "
                 f"--precision {precision} did not round anything")
    for name, val in (("fp32", fp32_val), (precision, low_val)):
        if not val < unigram:
            sys.exit(f"FAIL: the {name} run did not learn (validation {val} >= unigram {unigram})")
    if abs(low_val - fp32_val) > tolerance:
        sys.exit(f"FAIL: {precision}'s validation loss is {abs(low_val - fp32_val):.4f} nats from "
                 f"fp32's (tolerance {tolerance})")
    print("PASS")


if __name__ == "__main__":
    main()
