#!/usr/bin/env python3
"""PyTorch DDP peer for bench/scaling_bench (and, with --zero, for
bench/zero_bench): the GPT and ResNet-18 training steps of torch_models.py
(same models, optimizers and per-rank batch) on 1 or more CPU processes, one
compute thread each.

  /usr/bin/python3 bench/peers/torch_ddp.py --model gpt --ranks 2 --steps 10 --warmup 2
  /usr/bin/python3 bench/peers/torch_ddp.py --model gpt --ranks 2 --zero

--ranks 1 trains the plain model in this process (no DDP wrapper, no process
group): the single-process baseline weak scaling is measured against, as on
Loom's side. --ranks N > 1 spawns N processes (torch.multiprocessing) that
rendezvous over TCP on 127.0.0.1 with the gloo backend and wrap the model in
DistributedDataParallel with its defaults (1 MiB first bucket, 25 MiB later
buckets, gradients all-reduced during backward) except broadcast_buffers=False:
Loom's reducer does not broadcast BatchNorm buffers either, so both sides do
the same communication. --zero replaces the optimizer, for N > 1, by
torch.distributed.optim.ZeroRedundancyOptimizer with the same class and
hyper-parameters (optimizer state sharded: the ZeRO stage-1 equivalent; each
rank steps its share of the parameters, then the owners broadcast them).

A step is timed on every rank (zero_grad, forward, loss, backward with its
all-reduces, optimizer step); the step's time is the slowest rank's, and the
median over the timed steps is reported. Prints one JSON object on the last line:
  {"model": ..., "ranks": N, "optimizer": ..., "step_ms": [...], "median_ms": ..., "threads": 1}
"""
import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.optim import ZeroRedundancyOptimizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import make  # noqa: E402  (same directory)


def median(values):
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])


def ddp(model):
    """DistributedDataParallel with default buckets, buffers not broadcast."""
    # gloo cannot broadcast bool tensors (GPT's constant causal mask): the
    # initial state sync skips them; they are identical on every rank anyway.
    constant = [name for name, b in model.named_buffers() if b.dtype == torch.bool]
    DDP = torch.nn.parallel.DistributedDataParallel
    DDP._set_params_and_buffers_to_ignore_for_model(model, constant)
    return DDP(model, broadcast_buffers=False)


def train(args, rank, world):
    """Runs warm-up and timed steps; returns this rank's per-step times (ms)."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)  # same initial model everywhere (DDP also broadcasts rank 0's)
    model, opt, loss_fn = make(args.model, ddp if world > 1 else None)
    if args.zero and world > 1:
        # Same optimizer class and hyper-parameters, state sharded over the ranks.
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=type(opt),
                                      **opt.defaults)
    model.train()
    times = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()
        elapsed = time.perf_counter() - start
        if step >= args.warmup:
            times.append(elapsed * 1e3)
    return times


def worker(rank, args, world, port, queue):
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    times = train(args, rank, world)
    # The step's time is the slowest rank's.
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        queue.put(slowest.tolist())
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["gpt", "resnet"], required=True)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--zero", action="store_true",
                        help="ZeroRedundancyOptimizer (ZeRO stage 1) when --ranks > 1")
    args = parser.parse_args()
    if args.ranks < 1:
        parser.error(f"--ranks {args.ranks} must be at least 1")
    if args.ranks == 1:
        times = train(args, 0, 1)
    else:
        ctx = mp.get_context("spawn")
        queue = ctx.SimpleQueue()
        mp.spawn(worker, args=(args, args.ranks, free_port(), queue), nprocs=args.ranks,
                 join=True)
        times = queue.get()
    optimizer = "ZeroRedundancyOptimizer" if args.zero and args.ranks > 1 else "plain"
    print(json.dumps({"model": args.model, "ranks": args.ranks, "torch": torch.__version__,
                      "optimizer": optimizer, "threads": args.threads, "step_ms": times,
                      "median_ms": median(times)}))


if __name__ == "__main__":
    main()
