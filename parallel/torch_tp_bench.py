"""PyTorch's side of parallel/tp_benchmark.cc: the MLP Linear(1024, 4096) ->
GELU -> Linear(4096, 1024) on a batch of 64 rows, one thread per process:
one process on the whole model, then TP=2 and TP=4 (ColwiseParallel,
RowwiseParallel) as processes over gloo. Each row is the median of STEPS timed steps
(forward, backward of (y * w).sum(), zero_grad) after 5 untimed ones.

Usage: torch_tp_bench.py [STEPS]
"""
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

DIM, HIDDEN, BATCH, WARMUP = 1024, 4096, 64, 5


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN), torch.nn.GELU(),
                               torch.nn.Linear(HIDDEN, DIM))


def median_step_ms(model, steps):
    x, w = torch.randn(BATCH, DIM), torch.randn(BATCH, DIM)
    ms = []
    for i in range(WARMUP + steps):
        start = time.perf_counter()
        (model(x) * w).sum().backward()
        model.zero_grad()
        if i >= WARMUP:
            ms.append((time.perf_counter() - start) * 1e3)
    return statistics.median(ms)


def run(rank, n, steps, store):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=n)
    torch.manual_seed(0)
    model = parallelize_module(mlp(), init_device_mesh("cpu", (n,)),
                               {"0": ColwiseParallel(), "2": RowwiseParallel()})
    ms = median_step_ms(model, steps)
    if rank == 0:
        print(f"TpStep tp={n} batch={BATCH} median_ms={ms:.3f}", flush=True)
    dist.destroy_process_group()


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"OneProcessStep batch={BATCH} median_ms={median_step_ms(mlp(), steps):.3f}", flush=True)
    for n in (2, 4):
        with tempfile.TemporaryDirectory() as d:
            mp.start_processes(run, args=(n, steps, os.path.join(d, "store")), nprocs=n,
                               join=True, start_method="fork")


if __name__ == "__main__":
    main()
