#!/usr/bin/env python3
"""The PyTorch side of Loom's benchmark models, and bench/model_bench's peer.

The model definitions (GPT, ResNet-18 CIFAR), their optimizers and batches are
those of bench/bench_models.hpp; torch_ddp.py reuses them for scaling_bench
and zero_bench. Run as a script, this file times single-process training
steps for model_bench, which starts it with the interpreter of the peers'
virtual environment (`bash scripts/setup.sh --peers`: torch from PyPI, see
requirements.txt) and OMP_NUM_THREADS=MKL_NUM_THREADS=OPENBLAS_NUM_THREADS=1
set before Python starts (see peer_common.py):

  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
    .peers-venv/bin/python bench/peers/torch_models.py --model gpt --cores 0

Columns (--columns, all by default), each on a freshly built model (seed 0):
  eager    fp32 eager mode, as Loom runs;
  compile  torch.compile (Inductor on CPU) of forward and loss (backward
           compiled with it by AOTAutograd; the optimizer step stays eager);
           the first step, which compiles, is timed apart as compile_s and
           is not a warm-up step; a failed compilation is reported as "error"
           and the other columns still run;
  bf16     fp32 weights, forward and loss under
           torch.autocast(device_type="cpu", dtype=torch.bfloat16): a column
           of the peer only (Loom has no bf16 training yet).
A step is zero_grad, forward, loss, backward, optimizer step; each column
reports the median of --steps timed steps after --warmup, and the process's
CPU time over the wall time of the timed steps (cpu_share). Prints one JSON
object on the last line.

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
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402  (same directory)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


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


VOCAB, SEQ, BATCH_GPT, BATCH_RESNET, CLASSES = 8192, 128, 8, 32, 10


def build_model(name):
    if name == "gpt":
        return GPT(vocab=VOCAB, layers=4, d=256, heads=4, seq=SEQ)
    return ResNet18Cifar(CLASSES)


def optimizer_spec(name):
    """The optimizer's class and hyper-parameters (weight decay on every parameter)."""
    if name == "gpt":
        return torch.optim.AdamW, dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    return torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.0, weight_decay=5e-4,
                                 nesterov=False)


def build_optimizer(name, parameters):
    cls, hyper = optimizer_spec(name)
    return cls(parameters, **hyper)


def batch(name, rank):
    """One rank's random batch (step time does not depend on the data)."""
    generator = torch.Generator().manual_seed(1000 + rank)
    if name == "gpt":
        return (torch.randint(0, VOCAB, (BATCH_GPT, SEQ), generator=generator),
                torch.randint(0, VOCAB, (BATCH_GPT, SEQ), generator=generator))
    return (torch.randn(BATCH_RESNET, 3, 32, 32, generator=generator),
            torch.randint(0, CLASSES, (BATCH_RESNET,), generator=generator))


def loss_of(name, logits, targets):
    if name == "gpt":
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
    return F.cross_entropy(logits, targets)


def shard_units(name, model):
    """The submodules ZeRO stage 3 shards one by one, as zero_bench wraps
    Loom's: every GPT block; every child of ResNet-18's stem, every residual
    block and the classifier. The caller shards the whole model last."""
    if name == "gpt":
        return list(model.blocks)
    return list(model.stem) + list(model.blocks) + [model.fc]


def train_step(optimizer, forward_loss):
    optimizer.zero_grad(set_to_none=True)
    loss = forward_loss()
    loss.backward()
    optimizer.step()
    return loss


def run_column(name, column, steps, warmup):
    torch.manual_seed(0)
    model = build_model(name)
    optimizer = build_optimizer(name, model.parameters())
    x, y = batch(name, 0)
    model.train()
    result = {"column": column}

    def forward_loss(inputs, targets):
        return loss_of(name, model(inputs), targets)

    if column == "compile":
        # Compile in this process: a pool of compile workers would share the
        # cores the timed steps run on (and linger after compiling).
        torch._inductor.config.compile_threads = 1
        forward_loss = torch.compile(forward_loss)

    def step_loss():
        if column == "bf16":
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                return forward_loss(x, y)
        return forward_loss(x, y)

    if column == "compile":
        start = time.perf_counter()
        try:
            train_step(optimizer, step_loss)
        except Exception as error:  # noqa: BLE001  (reported, the other columns go on)
            lines = str(error).strip().splitlines() or [""]
            result["error"] = f"{type(error).__name__}: {lines[0][:300]}"
            return result
        result["compile_s"] = time.perf_counter() - start
    for _ in range(warmup):
        train_step(optimizer, step_loss)
    times, losses = [], []
    share = peer_common.CpuShare()
    with share:
        for _ in range(steps):
            start = time.perf_counter()
            loss = train_step(optimizer, step_loss)
            times.append((time.perf_counter() - start) * 1e3)
            losses.append(loss.item())
    result.update(step_ms=times, median_ms=peer_common.median(times), loss=losses,
                  cpu_share=share.share())
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["gpt", "resnet"], required=True)
    parser.add_argument("--columns", default="eager,compile,bf16",
                        help="comma-separated: eager, compile, bf16")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cores", default="",
                        help="cores to bind to, e.g. 0 or 0-1 (default: as started)")
    args = parser.parse_args()
    columns = args.columns.split(",")
    for column in columns:
        if column not in ("eager", "compile", "bf16"):
            parser.error(f"--columns: '{column}' is not one of eager, compile, bf16")
    cores = peer_common.parse_cores(args.cores)
    peer_common.pin(args.threads, cores[0] if cores else None)
    results = [run_column(args.model, column, args.steps, args.warmup) for column in columns]
    print(json.dumps({"model": args.model, "columns": results,
                      "peer_binding": [peer_common.binding()],
                      "peer_peak_rss_bytes": [peer_common.peak_rss_bytes()],
                      **peer_common.facts(torch)}))


if __name__ == "__main__":
    main()
