"""PyTorch's side of //parallel:ddp_benchmark's BM_DdpHookStep rows: the DDP
step of the 4x512 MLP with a 10-way head (SGD lr 0.01), 2 ranks over gloo,
one thread each, batch 32 per rank, without a communication hook and with
bf16_compress_hook, fp16_compress_hook and powerSGD_hook of rank 4 (from the
third step). The protocol of ../shared/peers/torch_ddp.py: a fresh model,
30 steps, the median of the last 25. Prints "<hook> <ms>" per hook.

Usage: torch_ddp_hooks.py [PORT]
"""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

HOOKS = ["none", "bf16", "fp16", "powersgd4"]


def model():
    torch.manual_seed(0)
    mods = []
    for _ in range(4):
        mods += [torch.nn.Linear(512, 512), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods, torch.nn.Linear(512, 10))


def worker(rank, port, q):
    # One gradient bucket: PyTorch's PowerSGD chains its later all_reduces
    # from the threads that complete the earlier ones, so with two buckets
    # the ranks can issue them in different orders, and over gloo the job
    # then hangs (it did on this machine). Ember's rows keep two buckets
    # (the first of 1 MiB), whose hooks' collectives it orders itself.
    dist._DEFAULT_FIRST_BUCKET_BYTES = 64 << 20
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    for name in HOOKS:
        ddp = torch.nn.parallel.DistributedDataParallel(model())
        if name == "bf16":
            ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        elif name == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif name == "powersgd4":
            state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=4,
                                       start_powerSGD_iter=2)
            ddp.register_comm_hook(state, psgd.powerSGD_hook)
        torch.manual_seed(100 + rank)
        x, y = torch.randn(32, 512), torch.randint(0, 10, (32,))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        ts = []
        for _ in range(30):
            s = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            ts.append(time.perf_counter() - s)
        if rank == 0:
            q.put((name, statistics.median(ts[5:]) * 1e3))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 29541
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(r, port, q)) for r in range(2)]
    [p.start() for p in ps]
    for _ in HOOKS:
        name, ms = q.get()
        print(f"{name} {ms:.2f}")
    [p.join() for p in ps]
