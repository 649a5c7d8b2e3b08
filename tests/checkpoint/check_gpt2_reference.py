#!/usr/bin/env python3
"""A consolidated Loom checkpoint is GPT-2: Hugging Face's definition of the
model, run here in numpy on what `loom-ckpt consolidate --gpt2` writes (the
weights and config.json), gives the logits Loom computes from the checkpoint.

  check_gpt2_reference.py LOOM_CKPT CHECKPOINT_DIR REFERENCE WORK_DIR

CHECKPOINT_DIR holds the tp 2 x dp 2 ZeRO-2 checkpoint of the test GPT (tanh
GELU, GPT-2's) that the hidden test case "[.ckpt_tool]" writes, with the
model's sizes in its info; REFERENCE is the safetensors file it writes beside
it: token ids [B, T] and the logits [B, T, V] one Loom rank computed from the
checkpoint.

The forward pass below follows transformers' GPT2LMHeadModel (eval mode),
configured by the config.json the tool wrote (n_head, n_layer, n_embd,
vocab_size, n_positions, activation_function, layer_norm_epsilon; checked
against the weights' shapes): Conv1D layers computing x @ W + b with W stored
[in, out]; c_attn's output columns are q, k, v in thirds, each split into
heads of contiguous columns; causal attention scaled by 1/sqrt(head size);
"gelu_new" (tanh) or "gelu" (erf); the head tied to wte. It reads the weights
with the safetensors package, as Hugging Face's loader does, and computes in
float64. The logits must agree to 1e-4 of their largest magnitude (Loom
computes in float32; here the difference is about 1e-7 of it).
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from test_venv import reexec_with_test_venv  # noqa: E402

try:
    import numpy as np
    from safetensors.numpy import load_file
except ImportError as e:
    reexec_with_test_venv(f"numpy or safetensors is not importable ({e})")
from gpt2_numpy import gpt2_logits  # noqa: E402


def main():
    tool, ckpt, reference, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "model.safetensors")
    command = [tool, "consolidate", ckpt, path, "--gpt2"]
    print("$ " + " ".join(command), flush=True)
    subprocess.run(command, check=True, timeout=120)
    with open(os.path.join(work, "config.json")) as f:
        config = json.load(f)
    print("config.json: " + json.dumps(config))

    params = {k: v.astype(np.float64) for k, v in load_file(path).items()}
    problems = []
    for key, value in [("model_type", "gpt2"), ("architectures", ["GPT2LMHeadModel"]),
                       ("activation_function", "gelu_new"), ("tie_word_embeddings", True),
                       ("n_layer", sum(k.endswith(".ln_1.weight") for k in params)),
                       ("vocab_size", params["wte.weight"].shape[0]),
                       ("n_embd", params["wte.weight"].shape[1]),
                       ("n_positions", params["wpe.weight"].shape[0])]:
        if config.get(key) != value:
            problems.append(f"config.json has {key} {config.get(key)!r}, the weights {value!r}")
    if problems:
        for p in problems:
            print("FAIL: " + p)
        return 1
    ref = load_file(reference)
    ids = ref["ids"].astype(np.int64)
    loom = ref["logits"].astype(np.float64)
    ours = gpt2_logits(params, ids, config)
    print(f"{len(params)} tensors, ids {list(ids.shape)}, logits {list(ours.shape)}")
    if ours.shape != loom.shape:
        print(f"FAIL: GPT-2's logits have shape {list(ours.shape)}, Loom's {list(loom.shape)}")
        return 1
    scale = np.abs(ours).max()
    error = np.abs(ours - loom).max()
    print(f"largest |logit| {scale:.4f}, largest difference {error:.3e} "
          f"({error / scale:.2e} of it; allowed 1e-4)")
    if not error <= 1e-4 * scale:
        worst = np.unravel_index(np.argmax(np.abs(ours - loom)), ours.shape)
        print(f"FAIL: logits differ at {tuple(int(i) for i in worst)}: GPT-2 {ours[worst]:.6f}, "
              f"Loom {loom[worst]:.6f}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
