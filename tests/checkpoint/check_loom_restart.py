#!/usr/bin/env python3
"""loom-restart runs a failed job again from its newest checkpoint.

  check_loom_restart.py MPIRUN TRAIN_GPT LOOM_RESTART WORK_DIR -- COMMON_ARGS...

COMMON_ARGS: a small GPT with --log-every 1 (the script adds --steps).
1. dp 2 with ZeRO-1 trains 300 steps uninterrupted: the reference.
2. The same under loom-restart, saving every 5 steps: once the step-10
   checkpoint is complete, one rank is killed (SIGKILL, as a lost node). The
   job fails, loom-restart runs it again with --resume, and the second attempt
   logs every step from its checkpoint to the last exactly as the reference
   (the same layout resumes bit for bit); two attempts, exit status 0.
3. A job that refuses its input (a layout the world cannot take: train_gpt
   exits 2) is not run again; a job that keeps failing otherwise (exit 1)
   is run twice, then given up as not transient: no new checkpoint in
   between.
4. SIGTERM to loom-restart (Slurm's time limit, a user) reaches the job and
   ends it without a restart: exit status 143.
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
from train_gpt_log import STEP, run  # noqa: E402

STEPS = 300


def rank_pids(program, marker):
    """The train_gpt processes whose command line names `marker`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].decode(errors="replace") == program and marker.encode() in argv:
            pids.append(int(entry))
    return pids


def main():
    argv = sys.argv[1:]
    mpirun, program, restart, work = argv[0], argv[1], argv[2], argv[3]
    common = argv[argv.index("--") + 1:] + ["--steps", str(STEPS), "--zero-stage", "1"]
    ckpt = os.path.join(work, "checkpoints")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    mp2 = [mpirun, "-np", "2", "--oversubscribe", program]
    problems = []

    _, reference, _ = run(mp2 + common)

    command = [restart, "--max-restarts", "2", "--"] + mp2 + common + [
        "--checkpoint-dir", ckpt, "--save-every", "5"]
    print("$ " + " ".join(command), flush=True)
    log_path = os.path.join(work, "restart.log")
    with open(log_path, "w") as log:
        job = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 240
        killed = None
        while job.poll() is None and time.monotonic() < deadline:
            if killed is None and os.path.exists(os.path.join(ckpt, "step-00000010",
                                                              "manifest.json")):
                pids = rank_pids(program, ckpt)
                if pids:
                    killed = max(pids)
                    os.kill(killed, signal.SIGKILL)
                    print(f"killed rank process {killed} of {sorted(pids)}", flush=True)
            time.sleep(0.002)
        if job.poll() is None:
            job.kill()
            problems.append("loom-restart did not end within 240 s")
        status = job.wait()
    with open(log_path) as f:
        text = f.read()
    print(text[-3000:])
    if killed is None:
        problems.append("no rank was killed: the first attempt ended before its step-10 "
                        "checkpoint was complete, or no rank process was found")
    if status != 0:
        problems.append(f"loom-restart exited {status}, expected 0")
    if text.count("loom-restart: attempt 2 of 3:") != 1 or "attempt 3 of 3" in text:
        problems.append("expected exactly two attempts")
    if "--resume" not in text.split("attempt 2 of 3:", 1)[-1].splitlines()[0]:
        problems.append("the second attempt was not run with --resume")
    second = text.split("attempt 2 of 3:", 1)[-1]
    resumed = re.search(r"at step (\d+)", second)
    if resumed is None:
        problems.append("the second attempt did not say where it resumed")
    logged = {int(m[1]): (m[2], m[3]) for m in STEP.finditer(second)}
    first = int(resumed[1]) if resumed else 0
    if sorted(logged) != list(range(first, STEPS)):
        problems.append(f"the second attempt logged steps {min(logged, default=None)}-"
                        f"{max(logged, default=None)}, expected {first}-{STEPS - 1}")
    if first < 10:
        problems.append(f"resumed at step {first}, before the step-10 checkpoint")
    for s, values in sorted(logged.items()):
        if values != reference.get(s):
            problems.append(f"step {s}: {values} after the restart, {reference.get(s)} "
                            "uninterrupted")
            break

    refused_dir = os.path.join(work, "refused")
    text, _, _ = run([restart, "--"] + mp2 + common + ["--tp", "3", "--checkpoint-dir",
                                                      refused_dir], expect_ok=False)
    if (len(re.findall(r"loom-restart: attempt \d+ of", text)) != 1
            or "exit status 2 means the job refused its input" not in text):
        problems.append("a job that refuses its input was run again")
    text, _, _ = run([restart, "--checkpoint-dir", refused_dir, "--", "sh", "-c", "exit 1"],
                     expect_ok=False)
    if len(re.findall(r"loom-restart: attempt \d+ of", text)) != 2 or "not transient" not in text:
        problems.append("a job that fails at once was not given up after two attempts")

    job = subprocess.Popen([restart, "--", "sleep", "60"], stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=30)
    print(err)
    if job.returncode != 143 or "not restarting" not in err or "attempt 2" in err:
        problems.append(f"SIGTERM: exit {job.returncode}, expected 143 without a restart")

    if problems:
        print("FAIL:\n  " + "\n  ".join(problems))
        return 1
    print(f"PASS: killed at or after step 10, resumed at step {first}; every later step as "
          "the uninterrupted run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
