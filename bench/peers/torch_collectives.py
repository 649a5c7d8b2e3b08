#!/usr/bin/env python3
"""gloo peer of bench/collective_bench: torch.distributed's all_reduce,
all_gather, reduce_scatter and broadcast over gloo on CPU tensors.

Each MPI rank of collective_bench starts one of these processes (bound to the
rank's own cores, OMP_NUM_THREADS=MKL_NUM_THREADS=OPENBLAS_NUM_THREADS=1 set
before Python starts) and drives it over stdin, so that Loom, raw MPI and gloo
take turns on the same cores within each size. Requests, one per line:

  measure OP COUNT ITERS   ITERS back-to-back calls of OP on a float32 tensor
                           of COUNT elements (the full tensor, as
                           collective_bench counts bytes) after a barrier;
                           replies "ok SECONDS", the slowest rank's seconds
                           per call, or "na REASON" when gloo cannot run OP
  done                     replies "record JSON" (this rank's binding, CPU
                           share of the timed calls, peak RSS, torch facts)
                           and exits

It prints "started" once torch is loaded and bound, then waits for a line
"connect" (sent when every rank's peer has started) and prints "ready" once
the gloo group is up (rendezvous over TCP on 127.0.0.1:--port). Anything
else it prints (warnings) is not a reply. all_reduce_symmetric, Loom's all-reduce on shared-memory tensors, is
plain all_reduce here: gloo has no such tensors.
"""
import argparse
import datetime
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402  (same directory)


def collective(torch, dist, op, count, world):
    """A call of `op` on buffers of `count` elements in all (count divisible by world)."""
    full = torch.ones(count, dtype=torch.float32)
    part = torch.ones(count // world, dtype=torch.float32)
    if op in ("all_reduce", "all_reduce_symmetric"):
        return lambda: dist.all_reduce(full)
    if op == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(part, full)
    if op == "all_gather":
        return lambda: dist.all_gather_into_tensor(full, part)
    if op == "broadcast":
        return lambda: dist.broadcast(full, src=0)
    raise ValueError(f"unknown op '{op}'")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cores", default="", help="cores to bind to, e.g. 1 (default: as started)")
    args = parser.parse_args()
    cores = peer_common.parse_cores(args.cores)
    torch = peer_common.pin(args.threads, cores[0] if cores else None)
    import torch.distributed as dist
    # Rendezvous only once every rank's peer has started (the driver says so):
    # one that failed to start would otherwise leave the others waiting.
    print("started", flush=True)
    if sys.stdin.readline().split() != ["connect"]:
        return
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(minutes=1))
    print("ready", flush=True)
    share = peer_common.CpuShare()
    key, call = None, None  # one op and size at a time: a 256 MiB buffer is enough
    for line in sys.stdin:
        words = line.split()
        if words == ["done"]:
            break
        op, count, iters = words[1], int(words[2]), int(words[3])
        if key != (op, count):
            key, call = None, None  # the previous buffers go before the next are made
            key, call = (op, count), collective(torch, dist, op, count, args.world)
        dist.barrier()
        try:
            with share:
                start = time.perf_counter()
                for _ in range(iters):
                    call()
                local = (time.perf_counter() - start) / iters
        except RuntimeError as error:  # the op is missing from gloo: the same on every rank
            print(f"na {str(error).splitlines()[0][:200]}", flush=True)
            continue
        slowest = torch.tensor([local], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        print(f"ok {slowest.item()!r}", flush=True)
    record = {"rank": args.rank, "peer_binding": peer_common.binding(),
              "peer_cpu_share": share.share(), "peer_peak_rss_bytes": peer_common.peak_rss_bytes(),
              **peer_common.facts(torch)}
    dist.barrier()
    dist.destroy_process_group()
    print("record " + json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
