#!/usr/bin/env python3
"""PyTorch data-parallel peer of bench/scaling_bench and bench/zero_bench: the
GPT and ResNet-18 training steps of torch_models.py (same models, optimizers,
hyper-parameters and per-rank batch), one process per rank with one thread,
launched by the same mpirun as Loom's ranks and bound to the same cores:

  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MASTER_PORT=29500 \\
    mpirun -np 2 -x OMP_NUM_THREADS -x MKL_NUM_THREADS -x OPENBLAS_NUM_THREADS \\
    -x MASTER_PORT .peers-venv/bin/python bench/peers/torch_ddp.py \\
    --model gpt --mode ddp --bucket-cap-mib 25 --cores 0/1

The benchmarks start it this way (see peer_common.py for why the thread
variables are set before Python starts). Rank and size come from the
launcher's environment; the processes rendezvous over TCP on MASTER_ADDR
(default 127.0.0.1) and MASTER_PORT with the gloo backend. --cores binds rank
r to the r-th '/'-separated group, the cores Loom's rank r ran on.

--mode:
  plain          one process, the model without any wrapper: the baseline of
                 weak scaling, as Loom's single rank trains without a reducer;
  ddp            DistributedDataParallel, buckets of --bucket-cap-mib (the cap
                 of Loom's reducer; the first bucket is 1 MiB on both sides),
                 forward_sync_buffers=False since Loom's reducer does not
                 broadcast BatchNorm buffers before each forward either (both
                 start from the same buffers): beside ZeRO stage 0 and Loom's
                 data-parallel ranks;
  zero1          ddp with torch.distributed.optim.ZeroRedundancyOptimizer (same
                 optimizer class and hyper-parameters, state sharded): beside
                 ZeRO stage 1;
  fsdp2          torch.distributed.fsdp.fully_shard on every unit Loom's stage 3
                 shards, then the whole model, reshard_after_forward=False
                 (parameters stay gathered from forward to backward; gradients
                 and optimizer state sharded): beside ZeRO stage 2;
  fsdp2-reshard  the same with reshard_after_forward=True: beside ZeRO stage 3.

A step (zero_grad, forward, loss, backward with its communication, optimizer
step) counts at the slowest rank's time; the median over the timed steps is
reported. Per rank the record gives the cores it was bound to, its CPU time
over the wall time of the timed steps, its peak RSS (getrusage ru_maxrss:
libraries, activations and buffers included) and the bytes of parameters,
gradients and optimizer state it holds after the last step (local shards
under FSDP2; DDP's own bucket buffers are not counted). Rank 0 prints one JSON
object on the last line.
"""
import argparse
import datetime
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_common  # noqa: E402  (same directory)

MODES = ("plain", "ddp", "zero1", "fsdp2", "fsdp2-reshard")


def local_bytes(tensors):
    """Bytes of the tensors this rank holds (a DTensor's local shard)."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        if hasattr(t, "to_local"):
            t = t.to_local()
        total += t.numel() * t.element_size()
    return total


def optimizer_bytes(optimizer):
    # ZeroRedundancyOptimizer keeps its shard's state in the wrapped optimizer.
    inner = getattr(optimizer, "optim", optimizer)
    return local_bytes(v for state in inner.state.values() for v in state.values()
                       if hasattr(v, "element_size"))


def wrap(torch, tm, args, model, world):
    """The model wrapped as --mode says, and its optimizer."""
    if args.mode in ("fsdp2", "fsdp2-reshard"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        reshard = args.mode == "fsdp2-reshard"
        for unit in tm.shard_units(args.model, model) + [model]:
            fully_shard(unit, mesh=mesh, reshard_after_forward=reshard)
        return model, tm.build_optimizer(args.model, model.parameters())
    if args.mode == "plain":
        return model, tm.build_optimizer(args.model, model.parameters())
    ddp = torch.nn.parallel.DistributedDataParallel
    # gloo cannot broadcast bool tensors (GPT's constant causal mask): DDP's
    # initial sync skips them; they are the same on every rank anyway.
    constant = [name for name, b in model.named_buffers() if b.dtype == torch.bool]
    ddp._set_params_and_buffers_to_ignore_for_model(model, constant)
    wrapped = ddp(model, forward_sync_buffers=False, bucket_cap_mb=args.bucket_cap_mib)
    if args.mode == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        cls, hyper = tm.optimizer_spec(args.model)
        return wrapped, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, **hyper)
    return wrapped, tm.build_optimizer(args.model, model.parameters())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["gpt", "resnet"], required=True)
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--bucket-cap-mib", type=float, default=25.0,
                        help="DDP's bucket cap: pass Loom's reducer's")
    parser.add_argument("--cores", default="",
                        help="cores per rank, ranks separated by '/', e.g. 0/1 (default: as started)")
    args = parser.parse_args()
    rank, world = peer_common.rank_and_world()
    if (world == 1) != (args.mode == "plain"):
        parser.error(f"--mode {args.mode} with {world} process(es): plain is for one, "
                     "the others for more")
    cores = peer_common.parse_cores(args.cores)
    if cores and len(cores) != world:
        parser.error(f"--cores gives {len(cores)} group(s) for {world} rank(s)")
    torch = peer_common.pin(args.threads, cores[rank] if cores else None)
    import torch.distributed as dist
    import torch_models as tm

    if world > 1:
        address = os.environ.get("MASTER_ADDR", "127.0.0.1")
        port = os.environ.get("MASTER_PORT")
        if not port:
            sys.exit("peer: MASTER_PORT is not set (the benchmarks pick a free port)")
        dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(minutes=5))
    torch.manual_seed(0)  # the same initial model on every rank, FSDP2 shards included
    model, optimizer = wrap(torch, tm, args, tm.build_model(args.model), world)
    x, y = tm.batch(args.model, rank)
    model.train()

    def forward_loss():
        return tm.loss_of(args.model, model(x), y)

    for _ in range(args.warmup):
        tm.train_step(optimizer, forward_loss)
    times = []
    share = peer_common.CpuShare()
    with share:
        for _ in range(args.steps):
            start = time.perf_counter()
            tm.train_step(optimizer, forward_loss)
            times.append((time.perf_counter() - start) * 1e3)
    mine = {"binding": peer_common.binding(), "cpu_share": share.share(),
            "peak_rss_bytes": peer_common.peak_rss_bytes(),
            "param_bytes": local_bytes(model.parameters()),
            "grad_bytes": local_bytes(p.grad for p in model.parameters()),
            "optimizer_bytes": optimizer_bytes(optimizer)}
    ranks = [mine]
    if world > 1:
        slowest = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        times = slowest.tolist()
        ranks = [None] * world
        dist.all_gather_object(ranks, mine)
        # The wrappers hold the process group: destroyed later, at interpreter
        # exit, its gloo threads end the process with std::terminate.
        del model, optimizer, forward_loss
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
    if rank != 0:
        return
    record = {"model": args.model, "mode": args.mode, "ranks": world, "step_ms": times,
              "median_ms": peer_common.median(times),
              "bucket_cap_mib": args.bucket_cap_mib if args.mode in ("ddp", "zero1") else None,
              **peer_common.facts(torch)}
    for key in ("binding", "cpu_share", "peak_rss_bytes", "param_bytes", "grad_bytes",
                "optimizer_bytes"):
        record["peer_" + key] = [r[key] for r in ranks]
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
