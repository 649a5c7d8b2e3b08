#!/usr/bin/env python3
"""SIGUSR1 stops a training run after the step it is in, with a checkpoint of it.

  check_stop_signal.py MPIRUN TRAIN_GPT TRAIN_RESNET WORK_DIR -- GPT_ARGS...

GPT_ARGS: a small GPT with --log-every 1 (the script adds --steps 300). For
train_gpt (dp 2, ZeRO-1) and train_resnet (dp 2, width 8 on synthetic
CIFAR-shaped batches):
1. 300 steps uninterrupted: the reference.
2. The same, saving every 10 steps; once the step-10 checkpoint is complete
   mpirun gets SIGUSR1 (as Slurm's --signal=USR1@T sends it), which it passes
   on to both ranks: the run says it stops, exits 0 well before step 300, and
   its newest checkpoint is the step after the last it logged.
3. --resume continues from that checkpoint and logs every later step
   exactly as the reference (the same layout resumes bit for bit).
Then --max-seconds 0.5 of 100,000 steps stops each program early, exit 0,
saying so, with a checkpoint of its last step (train_gpt: and its validation
loss).
Each run has a hard 240 s limit.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from train_gpt_log import run, step_mismatches  # noqa: E402

STEPS = 300
# Both programs' step lines: the step, then the loss and the norm as printed.
STEP = re.compile(r"^step\s+(\d+)\s+loss ([\d.]+)\s+lr \S+\s+norm ([\d.]+)", re.M)


def steps_of(text):
    return {int(m[1]): (m[2], m[3]) for m in STEP.finditer(text)}


def stop_and_resume(name, base, ckpt, problems):
    """`base` runs STEPS steps: stopped by SIGUSR1 after its step-10 checkpoint,
    resumed, against an uninterrupted run."""
    text, _, _ = run(base)
    reference = steps_of(text)
    command = base + ["--checkpoint-dir", ckpt, "--save-every", "10"]
    print("$ " + " ".join(command), flush=True)
    log_path = ckpt + ".log"
    sent = False
    with open(log_path, "w") as log:
        job = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 240
        while job.poll() is None and time.monotonic() < deadline:
            if not sent and os.path.exists(os.path.join(ckpt, "step-00000010", "manifest.json")):
                job.send_signal(signal.SIGUSR1)
                sent = True
            time.sleep(0.002)
        if job.poll() is None:
            job.kill()
            problems.append(f"{name}: the signalled run did not end within 240 s")
        status = job.wait()
    with open(log_path) as f:
        text = f.read()
    print(text[-1500:])
    last = max(steps_of(text), default=-1)
    if not sent:
        problems.append(f"{name}: the run ended before its step-10 checkpoint was complete")
    if status != 0:
        problems.append(f"{name}: the signalled run exited {status}, expected 0")
    if "SIGUSR1: stopping after this step, its checkpoint saved for --resume" not in text:
        problems.append(f"{name}: the run did not say that it stops on SIGUSR1")
    if not 10 <= last < STEPS - 1:
        problems.append(f"{name}: the signalled run logged up to step {last}, expected to "
                        "stop early")
    saved = sorted(d for d in os.listdir(ckpt)
                   if os.path.exists(os.path.join(ckpt, d, "manifest.json")))
    if not saved or saved[-1] != f"step-{last + 1:08d}":
        problems.append(f"{name}: newest checkpoint {saved[-1] if saved else None}, expected "
                        f"step-{last + 1:08d}, after the last logged step")
    text, _, _ = run(base + ["--checkpoint-dir", ckpt, "--resume"])
    got = steps_of(text)
    if not re.search(rf"at step {last + 1}\b", text):
        problems.append(f"{name}: --resume did not continue at step {last + 1}")
    if sorted(got) != list(range(last + 1, STEPS)):
        problems.append(f"{name}: the resumed run logged {len(got)} steps, expected "
                        f"{last + 1}-{STEPS - 1}")
    problems.extend(step_mismatches(name, got, reference, exact=True)[:5])
    return last


def main():
    argv = sys.argv[1:]
    mpirun, train_gpt, train_resnet, work = argv[0], argv[1], argv[2], argv[3]
    gpt_args = argv[argv.index("--") + 1:] + ["--zero-stage", "1"]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    problems = []
    mp2 = [mpirun, "-np", "2", "--oversubscribe"]
    stopped = {
        "train_gpt": stop_and_resume("train_gpt", mp2 + [train_gpt] + gpt_args +
                                     ["--steps", str(STEPS)], os.path.join(work, "gpt"),
                                     problems),
        "train_resnet": stop_and_resume(
            "train_resnet", mp2 + [train_resnet, "--data", "cifar", "--width", "8", "--batch",
                                   "4", "--lr", "0.05", "--log-every", "1", "--steps",
                                   str(STEPS)], os.path.join(work, "resnet"), problems),
    }

    timed_last = {}
    for name, program, args in (("train_gpt", train_gpt, gpt_args),
                                ("train_resnet", train_resnet,
                                 ["--data", "cifar", "--width", "8", "--batch", "4"])):
        timed = os.path.join(work, f"timed_{name}")
        text, _, val = run(mp2 + [program] + args +
                           ["--steps", "100000", "--max-seconds", "0.5", "--checkpoint-dir", timed,
                            "--save-every", "1000000"])
        said = re.search(r"^step\s+(\d+)  --max-seconds: stopping after this step, its "
                         r"checkpoint saved for --resume", text, re.M)
        last = int(said[1]) if said else -1
        timed_last[name] = last
        if not 0 <= last < 99999:
            problems.append(f"{name} --max-seconds 0.5: did not say it stops")
        if name == "train_gpt" and val is None:
            problems.append("train_gpt --max-seconds 0.5: no validation loss")
        if not os.path.exists(os.path.join(timed, f"step-{last + 1:08d}", "manifest.json")):
            problems.append(f"{name} --max-seconds 0.5 left no checkpoint of its last step, {last}")
    if problems:
        print("FAIL:\n  " + "\n  ".join(problems))
        return 1
    print(f"PASS: stopped on SIGUSR1 after steps {stopped}, resumed there bit for bit; "
          f"--max-seconds 0.5 stopped after steps {timed_last} with a checkpoint")
    return 0


if __name__ == "__main__":
    sys.exit(main())
