"""PyTorch's side of parallel/comm_hooks_test.cc: DDP with each built-in
communication hook, 2 ranks over gloo, on one MLP and one set of batches.

Usage: torch_comm_hooks.py OUT_DIR

Writes OUT_DIR/init.pt (the model's starting state_dict), OUT_DIR/data.pt
(x: [steps, 12, 16], y: [steps, 12]) and, per configuration,
OUT_DIR/final_<name>.pt (rank 0's state_dict after the steps), then prints
"done <names>".
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 6
LR = 0.1
WORLD = 2

# name -> PowerSGDState arguments (None: not PowerSGD)
CONFIGS = {
    "none": None,
    "allreduce": None,
    "fp16": None,
    "bf16": None,
    "psgd1": dict(matrix_approximation_rank=1, start_powerSGD_iter=2),
    "psgd4": dict(matrix_approximation_rank=4, start_powerSGD_iter=2),
    "psgd2_cold": dict(matrix_approximation_rank=2, start_powerSGD_iter=1,
                       use_error_feedback=False, warm_start=False, random_seed=7),
    "psgd1_batched": dict(matrix_approximation_rank=1, start_powerSGD_iter=3,
                          batch_tensors_with_same_shape=True),
}


def model():
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 4))


def run(rank, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(out, "store"),
                            rank=rank, world_size=WORLD)
    init = torch.load(os.path.join(out, "init.pt"))
    data = torch.load(os.path.join(out, "data.pt"))
    for name, args in CONFIGS.items():
        net = model()
        net.load_state_dict(init)
        ddp = DDP(net)
        if name == "allreduce":
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        elif name == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif name == "bf16":
            ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        elif args is not None:
            ddp.register_comm_hook(psgd.PowerSGDState(process_group=None, **args),
                                   psgd.powerSGD_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=LR)
        per = data["x"].shape[1] // WORLD
        for step in range(STEPS):
            x = data["x"][step, rank * per:(rank + 1) * per]
            y = data["y"][step, rank * per:(rank + 1) * per]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
        if rank == 0:
            torch.save(net.state_dict(), os.path.join(out, f"final_{name}.pt"))
        dist.barrier()
    dist.destroy_process_group()


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    torch.save(model().state_dict(), os.path.join(out, "init.pt"))
    torch.save({"x": torch.randn(STEPS, 12, 16), "y": torch.randint(0, 4, (STEPS, 12))},
               os.path.join(out, "data.pt"))
    mp.spawn(run, args=(out,), nprocs=WORLD, join=True)
    print("done", *CONFIGS)


if __name__ == "__main__":
    main()
