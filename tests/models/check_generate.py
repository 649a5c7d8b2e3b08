#!/usr/bin/env python3
"""loom-generate (models/gpt_generate.hpp) against GPT-2 run in numpy.

Writes a random GPT-2 in Hugging Face's folder layout (model.safetensors with
the "transformer." prefix, Conv1D weights, the attention-mask buffers and the
tied lm_head; config.json; vocab.json and merges.txt of a byte-level BPE that
Hugging Face's tokenizers trains here), then checks:
  - greedy generation (--temperature 0) past the 16-position window gives the
    ids GPT-2's forward pass in numpy (float64, tests/support/gpt2_numpy.py)
    picks, and the text is the prompt and those tokens' bytes;
  - sampling: top-k 1 is greedy, a seed repeats its ids, another seed does not;
  - under mpirun, the model split by --tp 2, --pp 2 and both draws the same
    greedy ids; layouts the model or the launch cannot take are refused;
  - Loom's byte-level tokens (--tokenizer bytes) on a model of 257 ids;
  - bad input ends with a message naming it.

  check_generate.py MPIRUN LOOM_GENERATE WORK_DIR
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from test_venv import reexec_with_test_venv  # noqa: E402

try:
    import numpy as np
    from safetensors.numpy import save_file
    from tokenizers import ByteLevelBPETokenizer, Tokenizer
except ImportError as e:
    reexec_with_test_venv(f"numpy, safetensors or tokenizers is not importable ({e})")
from gpt2_numpy import gpt2_logits  # noqa: E402

SEQ = 16


def byte_alphabet():
    """GPT-2's bytes_to_unicode, inverted: each character of its files' byte
    alphabet to the byte it stands for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(256 + n): b for n, b in enumerate(others)})
    return table


BYTE_OF = byte_alphabet()


def write_model(folder, vocab, seed):
    """A random GPT-2 (2 layers, width 32, 4 heads, 16 positions) as Hugging
    Face stores one; returns its parameters as gpt2_logits takes them."""
    rng = np.random.default_rng(seed)
    d, layers = 32, 2
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": vocab,
              "n_positions": SEQ, "n_embd": d, "n_layer": layers, "n_head": 4, "n_inner": None,
              "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
              "tie_word_embeddings": True}
    normal = lambda *shape, s=0.3: rng.normal(0, s, shape).astype(np.float32)  # noqa: E731
    p = {"wte.weight": normal(vocab, d, s=0.5), "wpe.weight": normal(SEQ, d, s=0.2),
         "ln_f.weight": 1 + normal(d, s=0.1), "ln_f.bias": normal(d, s=0.1)}
    for i in range(layers):
        h = f"h.{i}."
        p.update({h + "ln_1.weight": 1 + normal(d, s=0.1), h + "ln_1.bias": normal(d, s=0.1),
                  h + "attn.c_attn.weight": normal(d, 3 * d), h + "attn.c_attn.bias": normal(3 * d),
                  h + "attn.c_proj.weight": normal(d, d), h + "attn.c_proj.bias": normal(d),
                  h + "ln_2.weight": 1 + normal(d, s=0.1), h + "ln_2.bias": normal(d, s=0.1),
                  h + "mlp.c_fc.weight": normal(d, 4 * d), h + "mlp.c_fc.bias": normal(4 * d),
                  h + "mlp.c_proj.weight": normal(4 * d, d), h + "mlp.c_proj.bias": normal(d)})
    stored = {"transformer." + k: v for k, v in p.items()}
    for i in range(layers):
        stored[f"transformer.h.{i}.attn.bias"] = np.tril(np.ones((1, 1, SEQ, SEQ), np.float32))
    stored["lm_head.weight"] = p["wte.weight"]
    os.makedirs(folder, exist_ok=True)
    save_file(stored, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return {k: v.astype(np.float64) for k, v in p.items()}, config


def greedy(params, config, prompt, count):
    """GPT-2's greedy continuation over a sliding window of SEQ positions, and
    the smallest gap between the best and the second-best logit on the way."""
    ids, gap = list(prompt), np.inf
    for _ in range(count):
        logits = gpt2_logits(params, np.array([ids[-SEQ:]]), config)[0, -1]
        best, second = np.sort(logits)[::-1][:2]
        gap = min(gap, best - second)
        ids.append(int(np.argmax(logits)))
    return ids, gap


def run(tool, *args):
    result = subprocess.run([tool, *args], capture_output=True, timeout=120)
    return result.returncode, result.stdout, result.stderr.decode()


def ids_of(tool, *args):
    rc, out, err = run(tool, *args, "--ids")
    assert rc == 0, err
    return [int(t) for t in out.split()]


def main():
    mpirun, tool, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)

    # A GPT-2 folder: weights, config.json and a tokenizer of ~300 ids.
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    text = [open(__file__, encoding="utf-8").read()] * 4
    bpe.train_from_iterator(text, vocab_size=300, special_tokens=["<|endoftext|>"],
                            show_progress=False)
    folder = os.path.join(work, "gpt2")
    params, config = write_model(folder, bpe.get_vocab_size(), seed=1)
    bpe.save_model(folder)
    reference = Tokenizer.from_str(bpe._tokenizer.to_str())

    prompt = "def main():\n    return"
    prompt_ids = reference.encode(prompt).ids
    want, gap = greedy(params, config, prompt_ids, 30)
    got = ids_of(tool, "--model", folder, "--prompt", prompt, "--tokens", "30",
                 "--temperature", "0")
    print(f"greedy, {len(prompt_ids)} prompt + 30 tokens (window {SEQ}): loom {got[-30:]}")
    print(f"smallest gap between the two best logits on the way: {gap:.2e}")
    assert gap > 1e-4, "the reference's choices are too close to call in float32"
    assert got == want, f"numpy GPT-2 chose {want[-30:]}"
    rc, out, err = run(tool, "--model", folder, "--prompt", prompt, "--tokens", "30",
                       "--temperature", "0")
    assert rc == 0, err
    token_bytes = {i: bytes(BYTE_OF[c] for c in t) for t, i in bpe.get_vocab().items()}
    assert out == b"".join(token_bytes[i] for i in want) + b"\n", out
    print("the text is the prompt and those tokens' bytes; " + err.strip().splitlines()[-1])

    sampled = ["--model", folder, "--prompt", prompt, "--tokens", "30"]
    assert ids_of(tool, *sampled, "--temperature", "1", "--top-k", "1", "--seed", "5") == want
    one = ids_of(tool, *sampled, "--temperature", "1.5", "--top-k", "0", "--seed", "1")
    assert ids_of(tool, *sampled, "--temperature", "1.5", "--top-k", "0", "--seed", "1") == one
    assert ids_of(tool, *sampled, "--temperature", "1.5", "--top-k", "0", "--seed", "2") != one
    assert one[:len(prompt_ids)] == prompt_ids and len(one) == len(prompt_ids) + 30
    print("top-k 1 is greedy; seed 1 repeats its ids, seed 2 draws others")

    # The model split over ranks: each reads its slices of the weights, rank 0
    # prints what every rank draws (parallel/generate.hpp).
    # The 16-id prompt fills the window (every token reruns it); a 3-id one
    # runs 13 tokens through the key/value caches before the window slides.
    greedy_args = ["--model", folder, "--tokens", "30", "--temperature", "0"]
    short_ids = reference.encode("def").ids
    want_short, gap = greedy(params, config, short_ids, 30)
    assert gap > 1e-4 and len(short_ids) < SEQ // 2
    for ranks, layout in ((2, ["--tp", "2"]), (2, ["--pp", "2"]), (4, ["--tp", "2", "--pp", "2"])):
        for text, expected in ((prompt, want), ("def", want_short)):
            rc, out, err = run(mpirun, "-np", str(ranks), "--oversubscribe", tool, *greedy_args,
                               "--prompt", text, *layout, "--ids")
            assert rc == 0, err
            split = [int(t) for t in out.split()]
            assert split == expected, f"{' '.join(layout)}: {split[-30:]}, numpy {expected[-30:]}"
        print(f"{' '.join(layout)}: numpy's greedy ids; " + err.strip().splitlines()[-1])
    # A batch (models::generate_batch): two prompts, two samples each, drawn
    # with seeds 7, 8, 9, 10 as four separate runs draw them, on one rank and
    # split over ranks.
    sampling = ["--model", folder, "--tokens", "20", "--temperature", "1.2", "--top-k", "0"]
    alone = [ids_of(tool, *sampling, "--prompt", text, "--seed", str(7 + b))
             for b, text in enumerate([prompt, prompt, "def", "def"])]
    assert alone[0] != alone[1], "two samples of one prompt should differ"
    for ranks, layout in ((1, []), (2, ["--tp", "2"]), (2, ["--pp", "2"])):
        launch = [tool] if ranks == 1 else [mpirun, "-np", str(ranks), "--oversubscribe", tool]
        rc, out, err = run(*launch, *sampling, "--seed", "7", "--prompt", prompt, "--prompt", "def",
                           "--samples", "2", "--ids", *layout)
        assert rc == 0, err
        lines = out.decode().splitlines()
        assert lines[0::2] == [f"--- sequence {b}: prompt {b // 2}, seed {7 + b} ---"
                               for b in range(4)], lines
        batch = [[int(t) for t in line.split()] for line in lines[1::2]]
        assert batch == alone, f"{layout}: batch {batch}, alone {alone}"
        assert "4 sequences" in err, err
        print(f"a batch of 2 prompts x 2 samples {' '.join(layout) or 'on one rank'}: the four "
              "separate runs' ids; " + err.strip().splitlines()[-1])

    # --profile: each rank's per-op table, rank by rank.
    rc, _, err = run(mpirun, "-np", "2", "--oversubscribe", tool, *greedy_args, "--prompt", "a",
                     "--tp", "2", "--profile")
    assert rc == 0, err
    tables = [err.find("loom-generate: rank 0\n"), err.find("loom-generate: rank 1\n")]
    assert 0 <= tables[0] < tables[1] and err.count("linear.forward") == 2, err
    print("--profile: each rank's per-op table, in rank order")
    rc, _, err = run(mpirun, "-np", "3", "--oversubscribe", tool, *greedy_args, "--prompt", "a",
                     "--tp", "3")
    assert rc != 0 and "--tp 3 does not divide the model's 4 heads" in err, err
    rc, _, err = run(tool, *greedy_args, "--prompt", "a", "--tp", "2")
    assert rc == 1 and "--tp 2 x --pp 1 = 2 ranks, but the launch has 1" in err, err
    print("a layout the model or the launch cannot take is refused, naming the numbers")

    # Loom's byte-level tokens: a model of 257 ids, weights named by --weights.
    byte_folder = os.path.join(work, "bytes")
    byte_params, byte_config = write_model(byte_folder, 257, seed=2)
    weights = os.path.join(byte_folder, "model.safetensors")
    want, gap = greedy(byte_params, byte_config, list(b"ab"), 20)
    assert gap > 1e-4
    got = ids_of(tool, "--weights", weights, "--tokenizer", "bytes", "--prompt", "ab",
                 "--tokens", "20", "--temperature", "0")
    assert got == want, (got, want)
    rc, out, err = run(tool, "--weights", weights, "--tokenizer", "bytes", "--prompt", "ab",
                       "--tokens", "20", "--temperature", "0")
    assert rc == 0, err
    assert out == b"".join(b"<|endoftext|>" if t == 256 else bytes([t]) for t in want) + b"\n"
    print(f"--tokenizer bytes: greedy ids {got[2:]} as numpy's, printed as their bytes")

    # Bad input.
    cases = [
        (["--model", folder, "--prompt-ids", "5,999"], "prompt token 1 is 999, outside the "
                                                       "vocabulary [0, "),
        (["--model", folder, "--prompt-ids", "5,x"], "'x' is not a token id"),
        (["--model", folder, "--prompt", "a", "--temperature", "-1"], "temperature -1 is not"),
        (["--model", folder, "--prompt", "a", "--top-k", "100000"], "top_k 100000 is not in"),
        (["--model", folder, "--prompt-ids", "5", "--prompt-ids", "6,999"],
         "prompt 1: generate: prompt token 1 is 999"),
        (["--model", folder, "--prompt", "a", "--samples", "0"], "--samples 0 must be at least 1"),
        (["--weights", weights, "--prompt", "ab"], "--prompt needs a tokenizer"),
        (["--weights", os.path.join(work, "none.safetensors"), "--prompt-ids", "1"],
         "none.safetensors does not exist"),
        (["--weights", weights, "--config", os.path.join(work, "nope.json"), "--prompt-ids", "1"],
         "nope.json does not exist"),
    ]
    odd = dict(byte_config, n_inner=100)
    with open(os.path.join(work, "odd_config.json"), "w") as f:
        json.dump(odd, f)
    cases.append((["--weights", weights, "--config", os.path.join(work, "odd_config.json"),
                   "--prompt-ids", "1"], "n_inner 100 is not 4 x n_embd (128)"))
    wider = dict(byte_config, n_embd=64)
    with open(os.path.join(work, "wider_config.json"), "w") as f:
        json.dump(wider, f)
    cases.append((["--weights", weights, "--config", os.path.join(work, "wider_config.json"),
                   "--prompt-ids", "1"], "has shape [257, 32] where the model's parameter "
                                         "'wte.weight' needs [257, 64]"))
    for args, message in cases:
        rc, _, err = run(tool, *args)
        assert rc == 1 and message in err, f"{args}: rc {rc}, {err!r}, wanted {message!r}"
    print(f"{len(cases)} kinds of bad input refused, each naming the value and the rule")
    return 0


if __name__ == "__main__":
    sys.exit(main())
