#!/usr/bin/env python3
"""SIGUSR1 stops train_gpt after the step it is in, with a checkpoint of it.

  check_stop_signal.py MPIRUN TRAIN_GPT WORK_DIR -- COMMON_ARGS...

COMMON_ARGS: a small GPT with --log-every 1 (the script adds --steps 300).
1. dp 2 with ZeRO-1 trains 300 steps uninterrupted: the reference.
2. The same, saving every 10 steps; once the step-10 checkpoint is complete
   mpirun gets SIGUSR1 (as Slurm's --signal=USR1@T sends it), which it passes
   on to both ranks: the run says it stops, exits 0 well before step 300, and
   its newest checkpoint is the step after the last it logged.
3. --resume continues from that checkpoint and logs every later step
   exactly as the reference (the same layout resumes bit for bit).
4. --max-seconds 0.5 of 100,000 steps: the run stops early, exit 0, with its
   validation loss and a checkpoint of its last step.
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
from train_gpt_log import STEP, run, step_mismatches  # noqa: E402

STEPS = 300


def main():
    argv = sys.argv[1:]
    mpirun, program, work = argv[0], argv[1], argv[2]
    common = argv[argv.index("--") + 1:] + ["--steps", str(STEPS), "--zero-stage", "1"]
    ckpt = os.path.join(work, "checkpoints")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    mp2 = [mpirun, "-np", "2", "--oversubscribe", program]
    problems = []
    _, reference, _ = run(mp2 + common)

    command = mp2 + common + ["--checkpoint-dir", ckpt, "--save-every", "10"]
    print("$ " + " ".join(command), flush=True)
    log_path = os.path.join(work, "stopped.log")
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
            problems.append("the signalled run did not end within 240 s")
        status = job.wait()
    with open(log_path) as f:
        text = f.read()
    print(text[-2000:])
    logged = sorted(int(m[1]) for m in STEP.finditer(text))
    last = logged[-1] if logged else -1
    if not sent:
        problems.append("the run ended before its step-10 checkpoint was complete")
    if status != 0:
        problems.append(f"the signalled run exited {status}, expected 0")
    if "SIGUSR1: stopping after this step, its checkpoint saved for --resume" not in text:
        problems.append("the run did not say that it stops on SIGUSR1")
    if not 10 <= last < STEPS - 1:
        problems.append(f"the signalled run logged up to step {last}, expected to stop early")
    saved = sorted(d for d in os.listdir(ckpt) if os.path.exists(os.path.join(ckpt, d,
                                                                                "manifest.json")))
    if not saved or saved[-1] != f"step-{last + 1:08d}":
        problems.append(f"newest checkpoint {saved[-1] if saved else None}, expected the step "
                        f"after the last logged one, step-{last + 1:08d}")

    text, got, _ = run(mp2 + common + ["--checkpoint-dir", ckpt, "--resume"])
    if not re.search(rf"at step {last + 1}\b", text):
        problems.append(f"--resume did not continue at step {last + 1}")
    if sorted(got) != list(range(last + 1, STEPS)):
        problems.append(f"the resumed run logged {len(got)} steps, expected {last + 1}-{STEPS - 1}")
    problems.extend(m for m in step_mismatches("resumed", got, reference, exact=True)[:5])

    timed = os.path.join(work, "timed")
    budget = [a if a != str(STEPS) else "100000" for a in common]
    text, got, val = run(mp2 + budget + ["--max-seconds", "0.5", "--checkpoint-dir", timed,
                                         "--save-every", "1000000"])
    last = max(got, default=-1)
    if not 0 <= last < 99999 or val is None:
        problems.append(f"--max-seconds 0.5: logged up to step {last}, validation loss {val}")
    if not os.path.exists(os.path.join(timed, f"step-{last + 1:08d}", "manifest.json")):
        problems.append(f"--max-seconds 0.5 left no checkpoint of its last step, {last}")
    if problems:
        print("FAIL:\n  " + "\n  ".join(problems))
        return 1
    print(f"PASS: stopped after step {last} on SIGUSR1, resumed there bit for bit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
