"""PyTorch's side of parallel/ddp_controls_torch_test.cc: DDP's 2.x controls
on one model and one set of batches, 3 ranks over gloo.

Usage: torch_ddp_controls.py OUT_DIR

Writes OUT_DIR/init.pt (the model's starting state_dict), OUT_DIR/data.pt
(x: [steps, 3 * 4, 16], y: [steps, 3 * 4]; rank r's batch at a step is
rows 4r..4r+3) and, per configuration, OUT_DIR/final_<name>.pt (rank 0's
state_dict at the end), then prints "done <names>".

  join         Join on uneven inputs: rank r trains on 3 + 2r batches
  join_nodiv   the same with divide_by_initial_world_size=False
  static       static_graph=True on even inputs; `extra` is never used
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

WORLD = 3
PER = 4
STEPS = 7  # the most any rank trains on
LR = 0.1
CONFIGS = ["join", "join_nodiv", "static"]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 4)
        self.extra = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def steps_of(name, rank):
    return 3 + 2 * rank if name.startswith("join") else 5


def run(rank, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(out, "store"),
                            rank=rank, world_size=WORLD)
    init = torch.load(os.path.join(out, "init.pt"))
    data = torch.load(os.path.join(out, "data.pt"))
    for name in CONFIGS:
        net = Net()
        net.load_state_dict(init)
        if name == "static":
            ddp = DDP(net, static_graph=True)
        else:
            # `extra` gets no gradient: find it each iteration.
            ddp = DDP(net, find_unused_parameters=True)
        opt = torch.optim.SGD(ddp.parameters(), lr=LR)

        def train():
            for step in range(steps_of(name, rank)):
                x = data["x"][step, rank * PER:(rank + 1) * PER]
                y = data["y"][step, rank * PER:(rank + 1) * PER]
                opt.zero_grad()
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
                opt.step()

        if name.startswith("join"):
            with ddp.join(divide_by_initial_world_size=(name == "join")):
                train()
        else:
            train()
        if rank == 0:
            torch.save(net.state_dict(), os.path.join(out, f"final_{name}.pt"))
        dist.barrier()
    dist.destroy_process_group()


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    torch.save(Net().state_dict(), os.path.join(out, "init.pt"))
    torch.save({"x": torch.randn(STEPS, WORLD * PER, 16),
                "y": torch.randint(0, 4, (STEPS, WORLD * PER))},
               os.path.join(out, "data.pt"))
    mp.spawn(run, args=(out,), nprocs=WORLD, join=True)
    print("done", *CONFIGS)


if __name__ == "__main__":
    main()
