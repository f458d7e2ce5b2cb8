"""PyTorch's side of parallel/pipelining_benchmark.cc: torch.distributed.pipelining's
ScheduleGPipe and Schedule1F1B on the CPU over gloo, p = 2 and 4 ranks as
processes (one thread each), an MLP of 8 Linear(width, width) + ReLU layers
cut into p equal stages, a batch of 64 rows in m microbatches, mse_loss, SGD
lr 0.01; 2 untimed steps, then --steps timed ones. Prints, per rank and
configuration, the median step time beside the bubble (p - 1) / (m + p - 1)
(torch reports no idle time of its own).

Usage: torch_pipelining_bench.py [--steps=20] [--microbatches=8] [--width=512]
"""
import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

LAYERS = 8
BATCH = 64


def run(rank, world, schedule_name, args, store):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world)
    torch.manual_seed(0)
    layers = [torch.nn.Linear(args.width, args.width) for _ in range(LAYERS)]
    per = LAYERS // world
    mods = []
    for lin in layers[rank * per:(rank + 1) * per]:
        mods += [lin, torch.nn.ReLU()]
    part = torch.nn.Sequential(*mods)
    stage = PipelineStage(part, rank, world, torch.device("cpu"))
    cls = Schedule1F1B if schedule_name == "1F1B" else ScheduleGPipe
    sched = cls(stage, args.microbatches, loss_fn=torch.nn.functional.mse_loss)
    opt = torch.optim.SGD(part.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(17)
    x = torch.randn(BATCH, args.width, generator=gen)
    y = torch.randn(BATCH, args.width, generator=gen)
    times = []
    for step in range(2 + args.steps):
        start = time.perf_counter()
        opt.zero_grad()
        if rank == 0:
            sched.step(x)
        elif rank == world - 1:
            sched.step(target=y)
        else:
            sched.step()
        opt.step()
        if step >= 2:
            times.append((time.perf_counter() - start) * 1e3)
    m = args.microbatches
    bubble = (world - 1) / (m + world - 1)
    print(f"torch {schedule_name:<5} p={world} m={m} rank {rank}: step "
          f"{statistics.median(times):8.2f} ms  (bubble (p-1)/(m+p-1) {100 * bubble:5.1f}%)",
          flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    args = parser.parse_args()
    print(f"MLP of {LAYERS} Linear({args.width}, {args.width})+ReLU, batch {BATCH}, "
          f"{args.microbatches} microbatches, {args.steps} timed steps", flush=True)
    for world in (2, 4):
        for name in ("GPipe", "1F1B"):
            with tempfile.TemporaryDirectory() as d:
                mp.spawn(run, args=(world, name, args, os.path.join(d, "store")), nprocs=world)


if __name__ == "__main__":
    main()
