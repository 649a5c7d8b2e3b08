#!/usr/bin/env python3
"""plan_check: the layout planner's predicted step time against train_gpt's
measured one, on this machine, in the same run (docs/planner.md).

For each layout of 1 or 2 ranks of the pipeline benchmark's GPT (8 layers,
d_model 256, 4 heads, seq 128, vocab 8192, a global batch of 8 sequences),
`loom-plan --cluster host` predicts the step (its host preset measures the
GEMM rate now) and `train_gpt` runs it under mpirun, bound to cores; the
measured step is the median of the logged steps after the warm-up, and the
figure of a layout the median over rounds. Prints predicted / measured per
layout, and whether the planner ranks the layouts as they measured.

  python3 bench/plan_check.py [--build build] [--rounds 3] [--steps 8] [--json FILE]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

MODEL = ["--layers", "8", "--d-model", "256", "--heads", "4", "--seq", "128", "--vocab", "8192"]
GLOBAL_BATCH = 8

# (ranks, layout flags shared by loom-plan and train_gpt)
LAYOUTS = [
    (1, []),
    (1, ["--micro-batches", "8"]),
    (2, []),  # dp 2
    (2, ["--zero-stage", "1"]),
    (2, ["--zero-stage", "3"]),
    (2, ["--tp", "2"]),
    (2, ["--tp", "2", "--sequence-parallel"]),
    (2, ["--pp", "2", "--schedule", "1f1b", "--micro-batches", "8"]),
    (2, ["--pp", "2", "--schedule", "zb-h1", "--micro-batches", "8"]),
    (2, ["--pp", "2", "--schedule", "zb-v", "--micro-batches", "8"]),
    (2, ["--pp", "2", "--schedule", "gpipe", "--micro-batches", "4"]),
]


def flag(flags, name, default):
    return int(flags[flags.index(name) + 1]) if name in flags else default


def dp_of(ranks, flags):
    return ranks // (flag(flags, "--tp", 1) * flag(flags, "--pp", 1))


def predict(build, ranks, flags):
    """loom-plan's estimate of this layout on `ranks` host cores."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [os.path.join(build, "tools", "loom-plan"), "--cluster", "host",
               "--devices-per-node", str(ranks), "--precision", "fp32",
               "--batch", str(GLOBAL_BATCH), "--model", "train-gpt", *MODEL, *flags,
               "--json", out.name]
        # Evaluate mode needs one layout flag; a single rank names its tp.
        if not any(f.startswith("--") for f in flags):
            cmd += ["--tp", "1"]
        text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        record = json.load(open(out.name))
    peak = re.search(r"peak ([0-9.]+) TFLOP/s", text).group(1)
    layout = record["layouts"][0]
    if layout["refused"]:
        sys.exit(f"plan_check: loom-plan refused {flags}: {layout['refused']}")
    return layout, float(peak) * 1e12


def measure(build, ranks, flags, steps, warmup):
    """train_gpt's median logged step (ms) after `warmup` steps."""
    batch = GLOBAL_BATCH // dp_of(ranks, flags)
    cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "core",
           os.path.join(build, "examples", "train_gpt"), *MODEL, "--batch", str(batch),
           "--steps", str(steps + warmup), "--log-every", "1", "--eval-every", "0", *flags]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    text = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env,
                          timeout=600).stdout
    times = [float(m.group(2)) for m in
             re.finditer(r"^step\s+(\d+)\s+loss.*?([0-9.]+) ms", text, re.MULTILINE)
             if int(m.group(1)) >= warmup]
    if not times:
        sys.exit(f"plan_check: no step times in train_gpt's output for {flags}:\n{text[-2000:]}")
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json")
    args = parser.parse_args()

    measured = {i: [] for i in range(len(LAYOUTS))}
    predicted = {}
    peaks = []
    for round_ in range(args.rounds):
        for i, (ranks, flags) in enumerate(LAYOUTS):
            layout, peak = predict(args.build, ranks, flags)
            predicted.setdefault(i, []).append(layout)
            peaks.append(peak)
            measured[i].append(measure(args.build, ranks, flags, args.steps, args.warmup))
        print(f"  round {round_ + 1}/{args.rounds} done", flush=True)

    rows = []
    print(f"\nplan_check: GPT {' '.join(MODEL)}, global batch {GLOBAL_BATCH}; host GEMM peak "
          f"{statistics.median(peaks) / 1e9:.1f} GFLOP/s per core (median of the planner's "
          f"measurements); medians of {args.rounds} round(s)")
    print(f"{'ranks':>5}  {'layout':<46} {'predicted ms':>12} {'measured ms':>11} "
          f"{'pred/meas':>9} {'bubble':>6}")
    for i, (ranks, flags) in enumerate(LAYOUTS):
        step = statistics.median(p["step_ms"] for p in predicted[i])
        meas = statistics.median(measured[i])
        bubble = statistics.median(p["bubble_fraction"] for p in predicted[i])
        name = predicted[i][0]["layout"]
        rows.append({"ranks": ranks, "layout": name, "flags": " ".join(flags),
                     "predicted_step_ms": step, "measured_step_ms": meas,
                     "ratio": step / meas, "predicted_bubble": bubble,
                     "measured_rounds_ms": measured[i]})
        print(f"{ranks:>5}  {name:<46} {step:>12.1f} {meas:>11.1f} {step / meas:>9.2f} "
              f"{bubble:>6.3f}")
    # Ranking agreement among the 2-rank layouts: pairs ordered alike.
    two = [r for r in rows if r["ranks"] == 2]
    pairs = agree = 0
    for a in range(len(two)):
        for b in range(a + 1, len(two)):
            pairs += 1
            agree += ((two[a]["predicted_step_ms"] < two[b]["predicted_step_ms"]) ==
                      (two[a]["measured_step_ms"] < two[b]["measured_step_ms"]))
    ratios = [r["ratio"] for r in rows]
    print(f"pred/meas from {min(ratios):.2f} to {max(ratios):.2f} (median "
          f"{statistics.median(ratios):.2f}); 2-rank layouts ordered as measured in {agree} of "
          f"{pairs} pairs")
    if args.json:
        tmp = args.json + ".partial"
        with open(tmp, "w") as f:
            json.dump({"model": MODEL, "global_batch": GLOBAL_BATCH,
                       "peak_flops_per_core": statistics.median(peaks),
                       "rounds": args.rounds, "layouts": rows,
                       "pairs_ordered_alike": agree, "pairs": pairs}, f, indent=1)
        os.replace(tmp, args.json)


if __name__ == "__main__":
    main()
