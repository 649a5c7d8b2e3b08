#!/usr/bin/env python3
"""PyTorch peer for bench/model_bench: the same GPT and ResNet-18 training steps
as Loom's, timed the same way (median of per-step wall times after warm-up).

Run with Debian's interpreter (/usr/bin/python3, python3-torch 1.13, CPU) and
libopenblas0-pthread installed. Prints one JSON object on the last line:
  {"model": ..., "step_ms": [...], "median_ms": ..., "threads": 1, "loss": [...]}

The configurations are fixed by issue 4:
  gpt:    vocab 8192, 4 layers, d_model 256, 4 heads, seq 128, micro-batch 8,
          AdamW(lr 3e-4, betas 0.9/0.95, wd 0.1), no dropout; pre-LayerNorm,
          learned positions, tied input/output embedding, exact GELU, MLP 4x.
  resnet: ResNet-18, CIFAR stem (3x3 conv, no max-pool), 32x32, 10 classes,
          batch 32, SGD(lr 0.1, momentum 0.9, wd 5e-4).
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_proj = nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q = q.view(b, t, self.heads, hd).transpose(1, 2)
        k = k.view(b, t, self.heads, hd).transpose(1, 2)
        v = v.view(b, t, self.heads, hd).transpose(1, 2)
        s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        s = s.masked_fill(mask[:t, :t], float("-inf"))
        y = F.softmax(s, dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.proj(y)
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, layers, d, heads, seq):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for module in self.modules():  # GPT-2 initialisation, as Loom's GPT
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)
        mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
        self.register_buffer("mask", mask)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for block in self.blocks:
            x = block(x, self.mask)
        return self.ln_f(x) @ self.wte.weight.t()


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class ResNet18Cifar(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU())
        blocks, cin = [], 64
        for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def make(model_name, wrap=None):
    """Model, optimizer and a closure computing the loss of one step. `wrap`
    (e.g. DistributedDataParallel) wraps the model for the forward pass; the
    optimizer holds the unwrapped model's parameters."""
    if model_name == "gpt":
        model = GPT(vocab=8192, layers=4, d=256, heads=4, seq=128)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
        x = torch.randint(0, 8192, (8, 128))
        y = torch.randint(0, 8192, (8, 128))
        forward = wrap(model) if wrap else model
        loss_fn = lambda: F.cross_entropy(forward(x).view(-1, 8192), y.view(-1))
    else:
        model = ResNet18Cifar()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
        x = torch.randn(32, 3, 32, 32)
        y = torch.randint(0, 10, (32,))
        forward = wrap(model) if wrap else model
        loss_fn = lambda: F.cross_entropy(forward(x), y)
    return model, opt, loss_fn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["gpt", "resnet"], required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, opt, loss_fn = make(args.model)
    model.train()
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()
        elapsed = time.perf_counter() - start
        if step >= args.warmup:
            times.append(elapsed * 1e3)
            losses.append(loss.item())
    ordered = sorted(times)
    median = ordered[len(ordered) // 2] if len(ordered) % 2 else \
        0.5 * (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2])
    print(json.dumps({"model": args.model, "torch": torch.__version__,
                      "threads": torch.get_num_threads(), "step_ms": times,
                      "median_ms": median, "loss": losses}))


if __name__ == "__main__":
    main()
