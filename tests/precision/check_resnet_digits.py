#!/usr/bin/env python3
"""ResNet on the digits in bf16 is within a point of fp32's test accuracy (issue 17).

  check_resnet_digits.py TRAIN_RESNET POINTS -- ARGS...

Runs `TRAIN_RESNET --precision fp32 ARGS` and `--precision bf16 ARGS` and
compares the final test accuracies: bf16 >= fp32 - POINTS (percentage
points). Also requires the bf16 run to have rounded (some logged loss or
norm differs from fp32's) and both to have learned (above 90%). A missing
digits file is reported as a skip ("digits: cannot open").
"""
import re
import subprocess
import sys


def run(program, precision, args):
    out = subprocess.run([program, "--precision", precision, *args], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=600)
    if "digits: cannot open" in out.stdout:
        print(out.stdout)
        sys.exit(0)  # ctest's SKIP_REGULAR_EXPRESSION sees the message
    if out.returncode != 0:
        sys.exit(f"FAIL: train_resnet --precision {precision} exited {out.returncode}:\n"
                 f"{out.stdout}")
    steps = re.findall(r"^step +\d+ +loss (\S+) .* norm (\S+)", out.stdout, re.M)
    accuracy = re.findall(r"test accuracy ([\d.]+)%", out.stdout)
    if not steps or not accuracy:
        sys.exit(f"FAIL: no steps or accuracy in the output of --precision {precision}:\n"
                 f"{out.stdout}")
    return steps, float(accuracy[-1])


def main():
    program, points = sys.argv[1], float(sys.argv[2])
    args = sys.argv[sys.argv.index("--") + 1:]
    fp32_steps, fp32 = run(program, "fp32", args)
    bf16_steps, bf16 = run(program, "bf16", args)
    print(f"test accuracy: fp32 {fp32:.1f}%, bf16 {bf16:.1f}% (difference {bf16 - fp32:+.1f} "
          f"points, allowed -{points})")
    if fp32_steps == bf16_steps:
        sys.exit("FAIL: the bf16 run logged exactly the fp32 run's losses and norms: "
                 "--precision bf16 did not round anything")
    if min(fp32, bf16) < 90:
        sys.exit("FAIL: a run did not learn (test accuracy below 90%)")
    if bf16 < fp32 - points:
        sys.exit(f"FAIL: bf16 is {fp32 - bf16:.1f} points below fp32")
    return 0


if __name__ == "__main__":
    sys.exit(main())
