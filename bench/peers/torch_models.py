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
           torch.autocast(device_type=<the device>, dtype=torch.bfloat16),
           against Loom's bf16 precision;
  compile_bf16  torch.compile of the bf16 column's forward and loss (only
           when asked for).
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
and by the mixed-precision issue for GPUs (model_bench --device cuda):
  gpt2:     the gpt at GPT-2 124M's size: 12 layers, d_model 768, 12 heads,
            seq 1024, vocab 50304 (GPT-2's 50257 padded to a multiple of
            128, as llm.c), GPT-2's tanh GELU, batch 8;
  resnet50: ResNet-50 v1.5 (torchvision's layout: stride on the 3x3
            convolution), ImageNet stem, 224x224, 1000 classes, batch 32.
A GPT's attention (--attention) computes as Loom's does in the same run:
  math  written out: the scores materialised, masked, softmax, P V (Loom's
        materialized kernel);
  sdpa  F.scaled_dot_product_attention(q, k, v, is_causal=True), which
        PyTorch fuses (its flash-attention kernels on CPU and CUDA; Loom's
        fused kernel, the host's default);
model_bench passes the one Loom's GPT resolves to.
On --device cuda every step ends with torch.cuda.synchronize(), and TF32 is
off in matrix products and cuDNN convolutions alike (torch allows it in
convolutions by default): Loom's fp32 is full fp32 (CUBLAS_COMPUTE_32F,
CUDNN_FMA_MATH).
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
    def __init__(self, d, heads, gelu, attention="math"):
        super().__init__()
        self.heads = heads
        self.gelu = gelu  # F.gelu's approximate: "none" (exact) or "tanh"
        self.sdpa = attention == "sdpa"
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
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            s = s.masked_fill(mask[:t, :t], float("-inf"))
            y = F.softmax(s, dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.proj(y)
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate=self.gelu))


class GPT(nn.Module):
    def __init__(self, vocab, layers, d, heads, seq, gelu="none", attention="math"):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, gelu, attention) for _ in range(layers))
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
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x, self.mask)
        return self.ln_f(x) @ self.wte.weight.t()


def projection(cin, cout, stride):
    """A residual block's shortcut: a 1x1 convolution and BN where the block
    changes the shape, else None (the identity)."""
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = projection(cin, cout, stride)

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


class Bottleneck(nn.Module):
    """ResNet v1.5's bottleneck: 1x1, 3x3 (carrying the stride), 1x1 to 4x."""

    def __init__(self, cin, width, stride):
        super().__init__()
        cout = 4 * width
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.shortcut = projection(cin, cout, stride)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class ResNet50(nn.Module):
    """ImageNet stem (7x7/2 convolution, BN, ReLU, 3x3/2 max pool), stages of
    3, 4, 6, 3 bottlenecks, global average pool, Linear: 25,557,032
    parameters at 1000 classes, as Loom's models::resnet50."""

    def __init__(self, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], 64
        for width, count, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
            for i in range(count):
                blocks.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = 4 * width
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


VOCAB, SEQ, BATCH_GPT, BATCH_RESNET, CLASSES = 8192, 128, 8, 32, 10
# name: (vocab, layers, d_model, heads, seq) of the GPTs; the batches in rows.
GPT_SHAPES = {"gpt": (VOCAB, 4, 256, 4, SEQ), "gpt2": (50304, 12, 768, 12, 1024)}
# F.gelu's approximate per GPT: GPT-2's own tanh GELU for gpt2, as Loom's GPTConfig::gpt2_124m.
GPT_GELU = {"gpt": "none", "gpt2": "tanh"}
BATCHES = {"gpt": BATCH_GPT, "gpt2": 8, "resnet": BATCH_RESNET, "resnet50": 32}
MODELS = ("gpt", "resnet", "gpt2", "resnet50")


def is_gpt(name):
    return name in GPT_SHAPES


def build_model(name, attention="math"):
    if is_gpt(name):
        vocab, layers, d, heads, seq = GPT_SHAPES[name]
        return GPT(vocab=vocab, layers=layers, d=d, heads=heads, seq=seq, gelu=GPT_GELU[name],
                   attention=attention)
    if name == "resnet50":
        return ResNet50(1000)
    return ResNet18Cifar(CLASSES)


def optimizer_spec(name):
    """The optimizer's class and hyper-parameters (weight decay on every parameter)."""
    if is_gpt(name):
        return torch.optim.AdamW, dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    return torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.0, weight_decay=5e-4,
                                 nesterov=False)


def build_optimizer(name, parameters):
    cls, hyper = optimizer_spec(name)
    return cls(parameters, **hyper)


def batch(name, rank):
    """One rank's random batch, on the host (step time does not depend on the data)."""
    generator = torch.Generator().manual_seed(1000 + rank)
    rows = BATCHES[name]
    if is_gpt(name):
        vocab, seq = GPT_SHAPES[name][0], GPT_SHAPES[name][4]
        return (torch.randint(0, vocab, (rows, seq), generator=generator),
                torch.randint(0, vocab, (rows, seq), generator=generator))
    size, classes = (224, 1000) if name == "resnet50" else (32, CLASSES)
    return (torch.randn(rows, 3, size, size, generator=generator),
            torch.randint(0, classes, (rows,), generator=generator))


def loss_of(name, logits, targets):
    if is_gpt(name):
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
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


def run_column(name, column, steps, warmup, device="cpu", attention="math"):
    torch.manual_seed(0)
    model = build_model(name, attention).to(device)
    optimizer = build_optimizer(name, model.parameters())
    x, y = (t.to(device) for t in batch(name, 0))
    model.train()
    result = {"column": column}
    cuda = device.startswith("cuda")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def forward_loss(inputs, targets):
        return loss_of(name, model(inputs), targets)

    compiled = column in ("compile", "compile_bf16")
    if compiled:
        # Compile in this process: a pool of compile workers would share the
        # cores the timed steps run on (and linger after compiling).
        if not cuda:
            torch._inductor.config.compile_threads = 1
        forward_loss = torch.compile(forward_loss)

    def step_loss():
        if column in ("bf16", "compile_bf16"):
            with torch.autocast(device_type="cuda" if cuda else "cpu", dtype=torch.bfloat16):
                return forward_loss(x, y)
        return forward_loss(x, y)

    if compiled:
        start = time.perf_counter()
        try:
            train_step(optimizer, step_loss)
            sync()
        except Exception as error:  # noqa: BLE001  (reported, the other columns go on)
            lines = str(error).strip().splitlines() or [""]
            result["error"] = f"{type(error).__name__}: {lines[0][:300]}"
            return result
        result["compile_s"] = time.perf_counter() - start
    for _ in range(warmup):
        train_step(optimizer, step_loss)
    sync()
    times, losses = [], []
    share = peer_common.CpuShare()
    with share:
        for _ in range(steps):
            start = time.perf_counter()
            loss = train_step(optimizer, step_loss)
            sync()
            times.append((time.perf_counter() - start) * 1e3)
            losses.append(loss.item())
    result.update(step_ms=times, median_ms=peer_common.median(times), loss=losses,
                  cpu_share=share.share())
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--columns", default="eager,compile,bf16",
                        help="comma-separated: eager, compile, bf16, compile_bf16")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cores", default="",
                        help="cores to bind to, e.g. 0 or 0-1 (default: as started)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
    parser.add_argument("--attention", choices=("math", "sdpa"), default="math",
                        help="a GPT's attention: written out (math) or "
                             "F.scaled_dot_product_attention (sdpa)")
    args = parser.parse_args()
    columns = args.columns.split(",")
    for column in columns:
        if column not in ("eager", "compile", "bf16", "compile_bf16"):
            parser.error(f"--columns: '{column}' is not one of eager, compile, bf16, "
                         "compile_bf16")
    cores = peer_common.parse_cores(args.cores)
    peer_common.pin(args.threads, cores[0] if cores else None)
    device_facts = {"peer_device": args.device}
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            sys.exit(f"peer: --device {args.device}: torch {torch.__version__} sees no CUDA device")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        device_facts.update(
            peer_device_name=torch.cuda.get_device_name(torch.device(args.device)),
            peer_allow_tf32={"matmul": torch.backends.cuda.matmul.allow_tf32,
                             "cudnn": torch.backends.cudnn.allow_tf32})
    results = [run_column(args.model, column, args.steps, args.warmup, args.device,
                          args.attention) for column in columns]
    print(json.dumps({"model": args.model, "columns": results, **device_facts,
                      "peer_attention": args.attention,
                      "peer_binding": [peer_common.binding()],
                      "peer_peak_rss_bytes": [peer_common.peak_rss_bytes()],
                      **peer_common.facts(torch)}))


if __name__ == "__main__":
    main()
