"""GPT-2's forward pass as Hugging Face's GPT2LMHeadModel defines it (eval
mode), in numpy float64, for the tests that check Loom's GPT against it
(checkpoint/check_gpt2_reference.py, models/check_generate.py).

gpt2_logits(p, ids, config): p maps GPT-2's parameter names (without the
"transformer." prefix; Conv1D weights [in, out]) to arrays, ids is [B, T],
config is config.json's dictionary; returns the logits [B, T, vocab_size].
Conv1D layers compute x @ W + b; c_attn's output columns are q, k, v in
thirds, each split into heads of contiguous columns; attention is causal and
scaled by 1/sqrt(head size); "gelu_new" is the tanh GELU, "gelu" the exact
one; the head is tied to wte.
"""
import math

import numpy as np


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


GELU = {
    "gelu_new": lambda x: 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3))),
    "gelu": lambda x: 0.5 * x * (1.0 + np.vectorize(math.erf)(x / np.sqrt(2.0))),
}


def gpt2_logits(p, ids, config):
    batch, seq = ids.shape
    d, heads, eps = config["n_embd"], config["n_head"], config["layer_norm_epsilon"]
    gelu = GELU[config["activation_function"]]
    hd = d // heads
    x = p["wte.weight"][ids] + p["wpe.weight"][np.arange(seq)]
    causal = np.tril(np.ones((seq, seq), dtype=bool))
    for i in range(config["n_layer"]):
        h = lambda name: p[f"h.{i}.{name}"]  # noqa: E731
        a = layer_norm(x, h("ln_1.weight"), h("ln_1.bias"), eps)
        qkv = a @ h("attn.c_attn.weight") + h("attn.c_attn.bias")
        q, k, v = (t.reshape(batch, seq, heads, hd).transpose(0, 2, 1, 3)
                   for t in np.split(qkv, 3, axis=-1))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
        scores = np.where(causal, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        y = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, seq, d)
        x = x + y @ h("attn.c_proj.weight") + h("attn.c_proj.bias")
        m = layer_norm(x, h("ln_2.weight"), h("ln_2.bias"), eps)
        m = gelu(m @ h("mlp.c_fc.weight") + h("mlp.c_fc.bias"))
        x = x + m @ h("mlp.c_proj.weight") + h("mlp.c_proj.bias")
    x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"], eps)
    return x @ p["wte.weight"].T
