"""PyTorch's side of //parallel:zero_redundancy_optimizer_benchmark: the DDP
step of the 4x512 MLP with a 10-way head (cross-entropy, Adam lr 1e-3), 2
ranks over gloo, one thread each, batch 32 per rank, with plain Adam and with
torch.distributed.optim.ZeroRedundancyOptimizer(Adam) without and with
parameters_as_bucket_view. The protocol of ddp_benchmark.cc: a fresh model,
30 steps, the median of the last 25. Prints per row
"<row> <ms> state_bytes_rank0=<b> state_bytes_rank1=<b>", the bytes of the
optimizer-state tensors each rank holds (ZeRO: its local optimizer's).

Usage: torch_zero_redundancy_optimizer_bench.py [PORT] [STEPS]
"""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.optim import ZeroRedundancyOptimizer

ROWS = ["ddp_adam", "ddp_zero_adam/0", "ddp_zero_adam/1"]


def model():
    torch.manual_seed(0)
    mods = []
    for _ in range(4):
        mods += [torch.nn.Linear(512, 512), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods, torch.nn.Linear(512, 10))


def state_bytes(opt):
    local = opt.optim if isinstance(opt, ZeroRedundancyOptimizer) else opt
    return sum(v.numel() * v.element_size()
               for s in local.state.values() for v in s.values() if torch.is_tensor(v))


def worker(rank, port, steps, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    for row in ROWS:
        ddp = torch.nn.parallel.DistributedDataParallel(model())
        if row == "ddp_adam":
            opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
        else:
            opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam,
                                          parameters_as_bucket_view=row.endswith("/1"), lr=1e-3)
        torch.manual_seed(100 + rank)
        x, y = torch.randn(32, 512), torch.randint(0, 10, (32,))
        ts = []
        for _ in range(steps):
            s = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            ts.append(time.perf_counter() - s)
        b = torch.zeros(2, dtype=torch.int64)
        b[rank] = state_bytes(opt)
        dist.all_reduce(b)
        if rank == 0:
            q.put((row, statistics.median(ts[5:] or ts) * 1e3, b.tolist()))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 29543
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=worker, args=(r, port, steps, q)) for r in range(2)]
    [p.start() for p in ps]
    for _ in ROWS:
        row, ms, b = q.get()
        print(f"{row} {ms:.2f} state_bytes_rank0={b[0]} state_bytes_rank1={b[1]}")
    [p.join() for p in ps]
