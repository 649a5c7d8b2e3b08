#!/usr/bin/env python3
"""train_gpt --sample-tokens: the trained model's text at the end of a run.

  check_train_gpt_sample.py MPIRUN TRAIN_GPT LOOM_GENERATE WORK_DIR

On Loom's byte-level corpus, a small GPT trains 400 steps and writes 40
greedy tokens after "def ": the sample starts with the prompt, holds 40
tokens' bytes, and is the same in a second run; dp 2 with ZeRO-3 (whose
parameters are shards at rest, gathered for the sample) on the same global
batch writes the same text as one rank. Models split by tp 2 with sequence
parallelism, pp 2 (1F1B) and tp 2 x pp 2 (interleaved) draw on every rank
(parallel/generate.hpp) the text one rank draws from their final checkpoint,
and loom-generate --checkpoint writes it too under yet another layout. A sampled run (temperature 1) differs
from the greedy one and repeats itself; --samples 3 draws it and two more. --sample-prompt with an llm.c file of
GPT-2 tokens and no --tokenizer is refused, naming the file.
"""
import os
import re
import shutil
import struct
import subprocess
import sys

SAMPLE = re.compile(rb"^sample after step (\d+) \((\d+) tokens, temperature ([\d.]+), top-k (\d+), seed (\d+); "
                    rb"[\d.]+ ms per token\):\n(.*)\n\Z", re.M | re.S)


def run(command, expect_ok=True):
    print("$ " + " ".join(command), flush=True)
    out = subprocess.run(command, capture_output=True, timeout=240)
    if (out.returncode == 0) != expect_ok:
        sys.stdout.write((out.stdout + out.stderr).decode(errors="replace"))
        raise SystemExit(f"FAIL: exit status {out.returncode}")
    return out.stdout, out.stderr.decode(errors="replace")


def sample_of(stdout):
    """The last sample's text (the one the run ends with)."""
    match = SAMPLE.search(stdout, max(0, stdout.rfind(b"\nsample after step")))
    if not match:
        sys.stdout.write(stdout.decode(errors="replace"))
        raise SystemExit("FAIL: no sample at the end of the output")
    return match.group(6)


def main():
    mpirun, program, generate, work = sys.argv[1:5]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    tokens = os.path.join(work, "python_stdlib.tokens")
    common = ["--token-file", tokens, "--layers", "2", "--d-model", "64", "--heads", "4",
              "--seq", "32", "--steps", "400", "--lr", "3e-3", "--warmup", "10", "--log-every", "100", "--eval-every", "0",
              "--eval-batches", "1", "--sample-tokens", "40", "--sample-prompt", "def "]
    greedy = ["--sample-temperature", "0"]
    one = sample_of(run([program, "--batch", "8", *common, *greedy])[0])
    print(f"one rank, greedy: {one!r}")
    assert one.startswith(b"def "), one
    body = one[len(b"def "):]
    assert len(body.replace(b"<|endoftext|>", b"#")) == 40, len(body)
    assert sample_of(run([program, "--batch", "8", *common, *greedy])[0]) == one
    two = sample_of(run([mpirun, "-np", "2", "--oversubscribe", program, "--batch", "4",
                         "--zero-stage", "3", *common, *greedy])[0])
    assert two == one, f"dp 2 ZeRO-3 wrote {two!r}"
    print("the same text again, and from dp 2 with ZeRO-3")
    # A model split by tp or pp draws on all its ranks. 400 steps under
    # another layout drift from one rank's by rounding, so the split run's
    # sample is compared with one rank's from the same weights: its final
    # checkpoint, resumed on one rank with no step left to run.
    for ranks, layers, layout, other in (
            (2, "2", ["--tp", "2", "--sequence-parallel"], ["--pp", "2"]),
            (2, "2", ["--pp", "2", "--schedule", "1f1b", "--micro-batches", "2"], ["--tp", "2"]),
            (4, "4", ["--tp", "2", "--pp", "2", "--schedule", "interleaved", "--virtual-stages",
                      "2", "--micro-batches", "2"], [])):
        model = [layers if previous == "--layers" else a for previous, a in zip([""] + common, common)]
        where = os.path.join(work, "checkpoints_" + "_".join(a.strip("-") for a in layout))
        saved = ["--checkpoint-dir", where, "--save-every", "400"]
        split = sample_of(run([mpirun, "-np", str(ranks), "--oversubscribe", program, "--batch",
                               "8", *model, *greedy, *layout, *saved])[0])
        assert split.startswith(b"def "), split
        resumed = sample_of(run([program, "--batch", "8", *model, *greedy, "--checkpoint-dir",
                                 where, "--resume"])[0])
        assert split == resumed, f"{' '.join(layout)} wrote {split!r}, one rank {resumed!r}"
        # loom-generate reads the checkpoint under another layout.
        out, _ = run([mpirun, "-np", other[1] if other else "1", "--oversubscribe", generate,
                      "--checkpoint", where, *other, "--tokenizer", "bytes", "--prompt", "def ",
                      "--tokens", "40", "--temperature", "0"])
        assert out.rstrip(b"\n") == split, f"loom-generate {' '.join(other)} wrote {out!r}"
        print(f"{' '.join(layout)}: {split!r}, as one rank with its weights and loom-generate "
              f"{' '.join(other) or 'on one rank'} from its checkpoint")

    # A checkpoint of another model, or none, is refused naming it.
    other_sizes = os.path.join(work, "other_config.json")
    with open(other_sizes, "w") as f:
        f.write('{"vocab_size": 257, "n_positions": 32, "n_embd": 32, "n_layer": 2, "n_head": 4}')
    _, err = run([generate, "--checkpoint", where, "--config", other_sizes, "--prompt-ids", "1"],
                 expect_ok=False)
    assert "was saved as [257, 64] where the model needs [257, 32]" in err, err
    _, err = run([generate, "--checkpoint", work, "--prompt-ids", "1"], expect_ok=False)
    assert "no complete checkpoint there" in err, err
    print("loom-generate refuses a checkpoint of other sizes, and a folder without one")

    # --sample-every: a sample at step 199 and the last; training as without.
    out, _ = run([program, "--batch", "8", *common, *greedy, "--sample-every", "200"])
    assert sample_of(out) == one
    assert out.count(b"\nsample after step 199 (40 tokens") == 1, out[-3000:]
    plain, _ = run([program, "--batch", "8", *common, *greedy])
    losses = re.compile(rb"^step\s+\d+\s+loss \S+", re.M)
    assert losses.findall(out) == losses.findall(plain), "sampling changed the training"
    print("--sample-every 200: a sample at step 199, and the run logs what it logs without")

    sampled = ["--sample-temperature", "1", "--sample-top-k", "0"]
    drawn = sample_of(run([program, "--batch", "8", *common, *sampled])[0])
    assert drawn != one and drawn.startswith(b"def ")
    assert sample_of(run([program, "--batch", "8", *common, *sampled])[0]) == drawn
    print(f"temperature 1: {drawn!r}, repeated by the same seed")
    # --samples 3: one batch of three sequences at the end, seeds seed, seed + 1,
    # seed + 2; the first is the single sample of that seed.
    out = run([program, "--batch", "8", *common, *sampled, "--samples", "3"])[0]
    tail = out[out.find(b"sample after step 399"):]
    parts = [b"sample after step " + p for p in tail.split(b"sample after step ")[1:]]
    assert len(parts) == 3, tail
    texts = [SAMPLE.match(p).group(6) for p in parts]
    seeds = [int(SAMPLE.match(p).group(5)) for p in parts]
    assert seeds[1:] == [seeds[0] + 1, seeds[0] + 2], seeds
    assert texts[0] == drawn and len(set(texts)) == 3, texts
    print(f"--samples 3: seeds {seeds}, the first the single sample, all three different")

    llmc = os.path.join(work, "gpt2_tokens.bin")
    ids = [(i * 7919) % 50257 for i in range(4000)]
    with open(llmc, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(ids), *[0] * 253))
        f.write(struct.pack(f"<{len(ids)}H", *ids))
    _, err = run([program, "--token-file", llmc, "--layers", "1", "--d-model", "32", "--heads",
                  "2", "--seq", "16", "--batch", "2", "--steps", "1", "--sample-tokens", "5",
                  "--sample-prompt", "Hello"], expect_ok=False)
    assert "--sample-prompt: the token file" in err and "give --tokenizer" in err, err
    print("a prompt for GPT-2 tokens without their tokenizer is refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
