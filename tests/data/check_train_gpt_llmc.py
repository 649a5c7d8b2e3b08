#!/usr/bin/env python3
"""train_gpt trains on llm.c's token files (GPT-2 tokens).

  check_train_gpt_llmc.py MPIRUN TRAIN_GPT WORK_DIR

Writes a file as llm.c's dev/data scripts do (256 int32: magic 20240520,
version 1, the token count; then uint16 tokens), a repeating text of 97
distinct GPT-2 token ids, and trains on it: on one rank and as dp 2 (the
same global batch). The model's vocabulary is GPT-2's (50257: the first
loss is about ln 50257 = 10.825 at the initialisation), the loss falls by
more than a nat within 12 steps, and dp 2 logs what one rank logs to 1e-4.
Then `--model gpt2-124m` trains GPT-2 small's sizes on it for a step, and
refuses --layers beside it. Last, the same tokens as llm.c's shards: three
training files (`--token-file 'fineweb_train_*.bin'`) and a validation file
(`--val-token-file`), read as one stream: one rank and dp 2 log the same
losses and validation loss, and a pattern matching nothing is refused (exit
2) naming it.
"""
import math
import os
import shutil
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from train_gpt_log import run, step_mismatches, with_batch  # noqa: E402


def write_llmc(path, tokens):
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def main():
    mpirun, program, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    path = os.path.join(work, "tokens_val.bin")
    ids = [(i * 7919) % 50257 for i in range(97)]
    tokens = [ids[(i * 31 + i // 97) % 97] for i in range(40000)]
    write_llmc(path, tokens)

    common = ["--token-file", path, "--layers", "1", "--d-model", "32", "--heads", "2",
              "--seq", "32", "--batch", "4", "--steps", "12", "--log-every", "1",
              "--eval-every", "0", "--eval-batches", "1", "--lr", "1e-2", "--warmup", "0"]
    problems = []
    text, one, _ = run([program] + with_batch(common, 2))
    if "vocab 50257" not in text or "llm.c's file, GPT-2 tokens" not in text:
        problems.append("the run did not take the file as llm.c's, with GPT-2's vocabulary")
    if sorted(one) != list(range(12)):
        problems.append(f"one rank logged steps {sorted(one)}")
    else:
        first, last = float(one[0][0]), float(one[11][0])
        print(f"one rank: first loss {first}, last {last}, ln 50257 = {math.log(50257):.3f}")
        if abs(first - math.log(50257)) > 0.1:
            problems.append(f"the first loss {first} is not about ln 50257")
        if last > first - 1.0:
            problems.append(f"the loss fell from {first} to {last} only")
    _, two, _ = run([mpirun, "-np", "2", "--oversubscribe", program] + common)
    for s in sorted(one):
        (gl, gn), (wl, wn) = two.get(s, ("nan", "nan")), one[s]
        if not (abs(float(gl) - float(wl)) <= 1e-4 + 1e-4 * float(wl)
                and abs(float(gn) - float(wn)) <= 1e-4 + 1e-4 * float(wn)):
            problems.append(f"dp 2, step {s}: loss {gl} norm {gn}, one rank {wl} {wn}")
    # GPT-2 small's sizes by name, on the same tokens (one short step).
    text, steps, _ = run([program, "--token-file", path, "--model", "gpt2-124m", "--seq", "32",
                          "--batch", "1", "--steps", "1", "--log-every", "1", "--eval-every", "0",
                          "--eval-batches", "1"])
    if ("12 layers, d_model 768, 12 heads, seq 32, vocab 50257" not in text
            or "tanh GELU" not in text or sorted(steps) != [0]):
        problems.append("--model gpt2-124m did not train GPT-2 small's sizes")
    text, _, _ = run([program, "--token-file", path, "--model", "gpt2-124m", "--layers", "2"],
                     expect_ok=False)
    if "--model" not in text or "--layers" not in text:
        problems.append("--model with --layers was not refused naming both")

    # llm.c's shards: 3 training files and a validation file.
    shards = os.path.join(work, "shards")
    os.makedirs(shards)
    for i in range(3):
        write_llmc(os.path.join(shards, f"fineweb_train_{i + 1:06d}.bin"),
                   tokens[i * 10000:(i + 1) * 10000])
    write_llmc(os.path.join(shards, "fineweb_val_000000.bin"), tokens[30000:])
    sharded = ["--token-file", os.path.join(shards, "fineweb_train_*.bin"),
               "--val-token-file", os.path.join(shards, "fineweb_val_*.bin"),
               "--layers", "1", "--d-model", "32", "--heads", "2", "--seq", "32", "--batch", "4",
               "--steps", "6", "--log-every", "1", "--eval-every", "0", "--eval-batches", "2"]
    text, one, one_val = run([program] + with_batch(sharded, 2))
    if ("fineweb_train_000001.bin .. " not in text or "(3 files)" not in text
            or "train 30000; validation " not in text or "fineweb_val_000000.bin, 10000 tokens"
            not in text):
        problems.append("the sharded run did not name its 3 training files and validation file")
    if sorted(one) != list(range(6)) or one_val is None:
        problems.append(f"the sharded run logged steps {sorted(one)}, validation {one_val}")
    _, two, two_val = run([mpirun, "-np", "2", "--oversubscribe", program] + sharded)
    problems += step_mismatches("shards, dp 2", two, one, exact=False)
    if one_val is None or two_val is None or abs(float(one_val) - float(two_val)) > 1e-4:
        problems.append(f"shards: dp 2's validation loss {two_val}, one rank's {one_val}")
    out = subprocess.run([program, "--token-file", os.path.join(shards, "nope_*.bin")],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 2 or "nope_*.bin': no file matches the pattern" not in out.stderr:
        print(out.stdout + out.stderr)
        problems.append(f"a pattern matching no file exited {out.returncode}, not 2 naming it")
    for p in problems:
        print("FAIL: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
