#!/usr/bin/env python3
"""train_gpt saves distributed checkpoints and resumes from them under any layout.

  check_train_gpt_resume.py MPIRUN TRAIN_GPT WORK_DIR -- COMMON_ARGS...

COMMON_ARGS must hold --steps 8, --batch B and --log-every 1.
1. tp 2 x dp 2 with ZeRO-1 on 4 ranks trains 8 steps, saving every 4 steps.
2. The step-8 checkpoint loses its manifest (as a crash between the files
   and the manifest leaves it); --resume on the same layout starts from step 4
   and logs steps 4-7 exactly as the uninterrupted run did, and the same
   validation loss.
3. --resume on one rank (batch 2B), and on pp 2 (1F1B, 2 micro-batches, batch
   2B), logs the same losses and norms to the printed digit.
4. --resume on pp 2 x dp 2 with ZeRO-3 (ZB-H1, 2 micro-batches; parameters
   sharded at rest) logs the same losses and norms to the printed digit.
5. pp 2 x dp 2 with ZeRO-3 trains 8 steps from scratch, saving every 4 steps
   (the snapshot gathers the sharded parameters), as the first run to the
   printed digit; its step-8 checkpoint loses its manifest and --resume on
   the same layout logs steps 4-7 exactly as its uninterrupted run did.
6. --resume with another --seed is refused naming both seeds; with another
   token file, the same one less its last 1000 tokens, naming both token
   counts; with one as long whose first token differs, naming the stream's
   fingerprint.
Each run has a hard 240 s limit.
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from train_gpt_log import run, step_mismatches, with_batch  # noqa: E402


def main():
    argv = sys.argv[1:]
    mpirun, program, work = argv[0], argv[1], argv[2]
    common = argv[argv.index("--") + 1:]
    ckpt = os.path.join(work, "checkpoints")
    shutil.rmtree(ckpt, ignore_errors=True)
    os.makedirs(work, exist_ok=True)
    mp4 = [mpirun, "-np", "4", "--oversubscribe", program]
    layout = ["--tp", "2", "--zero-stage", "1"]
    _, whole, whole_val = run(mp4 + common + layout + ["--checkpoint-dir", ckpt, "--save-every", "4"])
    problems = []
    if sorted(whole) != list(range(8)):
        problems.append(f"the uninterrupted run logged steps {sorted(whole)}")
    os.remove(os.path.join(ckpt, "step-00000008", "manifest.json"))

    def check(name, command, exact, whole=whole, whole_val=whole_val):
        text, got, val = run(command)
        if "at step 4" not in text or "step-00000004" not in text:
            problems.append(f"{name}: did not resume from step-00000004 at step 4")
        if sorted(got) != [4, 5, 6, 7]:
            problems.append(f"{name}: logged steps {sorted(got)}, expected 4-7")
        problems.extend(step_mismatches(name, got, whole, exact))
        if val is None or (val != whole_val if exact else
                           abs(float(val) - float(whole_val)) > 1e-4 + 1e-4 * float(whole_val)):
            problems.append(f"{name}: validation loss {val}, uninterrupted {whole_val}")

    resume = ["--checkpoint-dir", ckpt, "--resume"]
    check("same layout", mp4 + common + layout + resume, exact=True)
    check("one rank", [program] + with_batch(common, 2) + resume, exact=False)
    check("pp 2", [mpirun, "-np", "2", "--oversubscribe", program] + with_batch(common, 2)
          + ["--pp", "2", "--schedule", "1f1b", "--micro-batches", "2"] + resume, exact=False)
    pp_zero3 = ["--pp", "2", "--schedule", "zb-h1", "--micro-batches", "2", "--zero-stage", "3"]
    check("pp 2 x dp 2, ZeRO-3", mp4 + common + pp_zero3 + resume, exact=False)
    # Saved under pp 2 x dp 2 with ZeRO-3, resumed there.
    ckpt3 = os.path.join(work, "checkpoints_pp_zero3")
    shutil.rmtree(ckpt3, ignore_errors=True)
    _, whole3, whole3_val = run(mp4 + common + pp_zero3 + ["--checkpoint-dir", ckpt3,
                                                           "--save-every", "4"])
    for s in sorted(whole):
        (gl, gn), (wl, wn) = whole3.get(s, ("nan", "nan")), whole[s]
        if not (abs(float(gl) - float(wl)) <= 1e-4 + 1e-4 * float(wl)
                and abs(float(gn) - float(wn)) <= 1e-3 + 1e-4 * float(wn)):
            problems.append(f"pp 2 x dp 2, ZeRO-3 from scratch, step {s}: loss {gl} norm {gn}, "
                            f"tp 2 x dp 2 {wl} {wn}")
    os.remove(os.path.join(ckpt3, "step-00000008", "manifest.json"))
    check("pp 2 x dp 2, ZeRO-3, its own checkpoint",
          mp4 + common + pp_zero3 + ["--checkpoint-dir", ckpt3, "--resume"], exact=True,
          whole=whole3, whole_val=whole3_val)
    seeded = list(common) + ["--seed", "2"] if "--seed" not in common else None
    if seeded is not None:
        text, _, _ = run([program] + with_batch(seeded, 2) + resume, expect_ok=False)
        if "was saved with seed 1, this run has 2" not in text:
            problems.append("a resume with another --seed was not refused naming both seeds")
    # Another token file: the same tokens less the last 1000 (Loom's header:
    # the token count at byte 16, the u16 tokens from byte 32).
    tokens_path = common[common.index("--token-file") + 1]
    shorter = os.path.join(work, "shorter.tokens")
    with open(tokens_path, "rb") as f:
        data = f.read()
    count = int.from_bytes(data[16:24], "little") - 1000
    with open(shorter, "wb") as f:
        f.write(data[:16] + count.to_bytes(8, "little") + data[24:32] + data[32:32 + 2 * count])
    other = list(common)
    other[other.index("--token-file") + 1] = shorter
    text, _, _ = run([program] + with_batch(other, 2) + resume, expect_ok=False)
    if "was saved with train_tokens" not in text or "this run has" not in text:
        problems.append("a resume on another token file was not refused naming the token counts")
    # As long, its first token changed (to the next id below the vocabulary,
    # at byte 12): the fingerprint differs.
    altered = os.path.join(work, "altered.tokens")
    vocab = int.from_bytes(data[12:16], "little")
    first = (int.from_bytes(data[32:34], "little") + 1) % vocab
    with open(altered, "wb") as f:
        f.write(data[:32] + first.to_bytes(2, "little") + data[34:])
    other[other.index("--token-file") + 1] = altered
    text, _, _ = run([program] + with_batch(other, 2) + resume, expect_ok=False)
    if "was saved with train_tokens_fingerprint" not in text:
        problems.append("a resume on other tokens of the same length was not refused")
    for p in problems:
        print("FAIL: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
