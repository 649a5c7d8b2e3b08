#!/usr/bin/env python3
"""PyTorch ZeRO-1 peer for bench/zero_bench: the GPT and ResNet-18 training
steps of torch_models.py (same models, optimizers and per-rank batch) with
torch.distributed.optim.ZeroRedundancyOptimizer (optimizer state sharded,
the stage-1 equivalent) on top of DistributedDataParallel over gloo, on N CPU
processes with one compute thread each.

  /usr/bin/python3 bench/peers/torch_zero.py --model gpt --ranks 2 --steps 10 --warmup 2

--ranks 1 trains the plain model with its plain optimizer in this process (no
DDP, no process group): the single-process baseline of the weak-scaling
efficiency, as in torch_ddp.py. --ranks N > 1 spawns N processes that
rendezvous over TCP on 127.0.0.1 (gloo) and wrap the model as torch_ddp.py
does (default buckets, broadcast_buffers=False); the optimizer torch_models
builds is replaced by a ZeroRedundancyOptimizer with the same class and
hyper-parameters (each rank steps its share of the parameters, then the
updated parameters are broadcast from their owners).

A step (zero_grad, forward, loss, backward with DDP's all-reduces, the
sharded optimizer step with its broadcasts) is timed on every rank; the
step's time is the slowest rank's; the median over the timed steps is
reported. Prints one JSON object on the last line:
  {"model": ..., "ranks": N, "step_ms": [...], "median_ms": ..., "threads": 1}
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.optim import ZeroRedundancyOptimizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_ddp import ddp, free_port, median  # noqa: E402  (same directory)
from torch_models import make  # noqa: E402


def train(args, rank, world):
    """Runs warm-up and timed steps; returns this rank's per-step times (ms)."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)  # same initial model everywhere (DDP also broadcasts rank 0's)
    model, opt, loss_fn = make(args.model, ddp if world > 1 else None)
    if world > 1:
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
    slowest = torch.tensor(times, dtype=torch.float64)  # the step's time is the slowest rank's
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        queue.put(slowest.tolist())
    dist.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["gpt", "resnet"], required=True)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
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
    print(json.dumps({"model": args.model, "ranks": args.ranks, "torch": torch.__version__,
                      "optimizer": "ZeroRedundancyOptimizer" if args.ranks > 1 else "plain",
                      "threads": args.threads, "step_ms": times, "median_ms": median(times)}))


if __name__ == "__main__":
    main()
