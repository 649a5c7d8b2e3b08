#!/usr/bin/env python3
"""loom-plan end to end: a plan, its JSON, the recommendation, refusals and
bad input (tools/loom_plan.cpp, docs/planner.md). Usage: check_loom_plan.py LOOM_PLAN WORKDIR"""
import json
import os
import subprocess
import sys

plan, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
failures = []


def run(*args):
    p = subprocess.run([plan, *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def expect(condition, what, output=""):
    if not condition:
        failures.append(what + ("\n" + output[-3000:] if output else ""))


# GPT-2 124M, 512 sequences, one node of 8 H100s: fitting layouts by step,
# the recommendation within 2% of the fastest and its command.
path = os.path.join(work, "plan.json")
code, out = run("--model", "gpt2-124m", "--batch", "512", "--cluster", "h100-sxm",
                "--top", "5", "--json", path)
expect(code == 0, f"a plan that fits exits 0, not {code}", out)
expect("recommended: #" in out and "mpirun -np 8 train_gpt --layers 12 --d-model 768" in out,
       "the recommendation names its layout and train_gpt command", out)
expect(not os.path.exists(path + ".partial"), "the JSON is renamed into place")
record = json.load(open(path))
fitting = [l for l in record["layouts"] if not l["refused"]]
expect(len(fitting) > 10, f"many layouts fit, {len(fitting)} did")
steps = [l["step_ms"] for l in fitting]
expect(steps == sorted(steps), "fitting layouts come fastest first")
chosen = [l for l in record["layouts"] if l["recommended"]]
expect(len(chosen) == 1, f"one layout is recommended, {len(chosen)} were")
if chosen:
    expect(chosen[0]["step_ms"] <= 1.02 * steps[0], "the recommendation is within 2% of the fastest")
    expect(f"--batch {512 // chosen[0]['dp']}" in out, "train_gpt's --batch is per replica", out)
refused = [l for l in record["layouts"] if l["refused"]]
expect(any("does not divide" in l["refused"] or "GiB per device" in l["refused"] for l in refused),
       "refused layouts say why")

# Two nodes: the command is srun's.
code, out = run("--model", "gpt2-350m", "--batch", "256", "--cluster", "a100-sxm", "--nodes", "2",
                "--top", "3")
expect(code == 0 and "srun -n 16 train_gpt" in out, "two nodes: srun -n 16", out)

# One layout evaluated, refused: tp 4 cannot stay in a node of 2.
code, out = run("--model", "gpt2-124m", "--batch", "512", "--nodes", "4", "--devices-per-node",
                "2", "--tp", "4")
expect(code == 1 and "tp 4 does not divide the 2 devices of a node" in out,
       f"an evaluated layout that cannot run exits 1 naming the rule, not {code}", out)
code, out = run("--model", "gpt2-124m", "--batch", "512", "--tp", "3")
expect(code == 2 and "--tp 3 x --pp 1 does not divide the cluster's 8 ranks" in out,
       f"a layout that does not divide the ranks exits 2, not {code}", out)

# Nothing fits in half a GiB.
code, out = run("--model", "gpt2-124m", "--batch", "512", "--memory-gib", "0.5")
expect(code == 1 and "(no layout fits)" in out and "GiB per device, 0.5 GiB available" in out,
       f"no fitting layout exits 1 and shows the closest, not {code}", out)

# Bad input: a clear error, exit 2.
code, out = run("--cluster", "nope")
expect(code == 2 and "--cluster nope: the presets are h100-sxm, a100-sxm and host" in out,
       f"an unknown preset exits 2 naming the presets, not {code}", out)
code, out = run("--model", "gpt2-124m", "--heads", "7")
expect(code == 2 and "7" in out, f"heads that do not divide d_model exit 2, not {code}", out)

# Long sequences: the fused attention keeps less, and its command says so.
def best_activation_gib(out):
    rows = [l.split() for l in out.splitlines() if l.strip().startswith("1 ")]
    return float(rows[0][-5]) if rows else -1.0  # the "act" column


long_plan = ("--model", "gpt2-124m", "--seq", "4096", "--batch", "64", "--tp", "1", "--pp", "1",
             "--zero-stage", "3", "--micro-batches", "8")
code, plain = run(*long_plan)
code_fused, fused = run(*long_plan, "--attention", "fused")
expect(code == 0 and code_fused == 0, f"long-sequence plans exit 0, not {code}, {code_fused}",
       plain + fused)
expect("--attention fused" in fused and "--attention" not in plain,
       "the fused attention's command carries --attention fused", fused)
expect(0 < best_activation_gib(fused) < best_activation_gib(plain),
       "the fused attention keeps fewer activation bytes", plain + fused)
code, out = run("--model", "gpt2-124m", "--attention", "flash")
expect(code != 0 and "flash not in {auto,materialized,fused}" in out,
       f"an unknown --attention is refused naming it, exit {code}", out)
# The default (auto) is the materialised attention on GPUs (above: it keeps
# more than the fused one) and the fused one on the host.
host_plan = ("--cluster", "host", "--model", "gpt2-124m", "--seq", "1024", "--batch", "2",
             "--tp", "1", "--pp", "1", "--micro-batches", "1", "--precision", "fp32")
code, host_auto = run(*host_plan)
code_m, host_materialized = run(*host_plan, "--attention", "materialized")
code_f, host_fused = run(*host_plan, "--attention", "fused")
expect(code == code_m == code_f == 0 and
       best_activation_gib(host_auto) == best_activation_gib(host_fused) <
       best_activation_gib(host_materialized),
       "auto keeps what the fused attention keeps on the host", host_auto + host_materialized)

# This machine, measured: the pipeline benchmark's GPT on its cores.
code, out = run("--cluster", "host", "--model", "train-gpt", "--layers", "8", "--d-model", "256",
                "--seq", "128", "--vocab", "8192", "--batch", "8", "--precision", "fp32")
expect(code == 0 and "recommended: #" in out, f"the host preset plans, exit {code}", out)

for f in failures:
    print("FAILED:", f)
print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
