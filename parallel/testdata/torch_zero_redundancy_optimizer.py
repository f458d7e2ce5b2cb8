"""PyTorch's side of parallel/zero_redundancy_optimizer_torch_test.cc: DDP +
torch.distributed.optim.ZeroRedundancyOptimizer, 2 ranks over gloo, on one
MLP and one set of batches, with SGD (momentum) and Adam, with and without
parameters_as_bucket_view, a StepLR(2, 0.5) on the optimizer; in float64
(the model converted after loading init.pt, the batches converted), and
once in float32 (adam_f32), where both libraries' float32 kernels round.

Usage: torch_zero_redundancy_optimizer.py OUT_DIR

Writes OUT_DIR/init.pt (the model's starting state_dict), OUT_DIR/data.pt
(x: [steps, 8, 16], y: [steps, 8]) and, per configuration <name>:
  final_<name>.pt      rank 0's model state_dict after the steps;
  partition_<name>.pt  {"rank<r>": int64 positions rank r updates, in order};
  state_<name>.pt      the consolidated optimizer state on rank 0, flattened:
                       {"<position>.<state name>": tensor, "lr": [lr]}.
Prints "done <names>".
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 5
WORLD = 2
PER_RANK = 4

SGD = (torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=1e-3))
ADAM = (torch.optim.Adam, dict(lr=0.01, weight_decay=1e-3))
# name -> (optimizer, its options, parameters_as_bucket_view, dtype)
CONFIGS = {
    "sgd": (*SGD, False, torch.float64),
    "sgd_bucket_view": (*SGD, True, torch.float64),
    "adam": (*ADAM, False, torch.float64),
    "adam_bucket_view": (*ADAM, True, torch.float64),
    "adam_f32": (*ADAM, False, torch.float32),
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
    for name, (cls, kwargs, view, dtype) in CONFIGS.items():
        net = model()
        net.load_state_dict(init)
        net.to(dtype)
        ddp = DDP(net)
        params = list(ddp.parameters())
        opt = ZeroRedundancyOptimizer(params, optimizer_class=cls,
                                      parameters_as_bucket_view=view, **kwargs)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        for step in range(STEPS):
            x = data["x"][step, rank * PER_RANK:(rank + 1) * PER_RANK].to(dtype)
            y = data["y"][step, rank * PER_RANK:(rank + 1) * PER_RANK]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            sched.step()
        opt.consolidate_state_dict(to=0)
        if rank == 0:
            torch.save({k: v.detach().clone() for k, v in net.state_dict().items()},
                       os.path.join(out, f"final_{name}.pt"))
            position = {p: i for i, p in enumerate(params)}
            partition = {}
            for r, groups in enumerate(opt._partition_parameters()):
                partition[f"rank{r}"] = torch.tensor(
                    [position[p] for g in groups for p in g["params"]], dtype=torch.int64)
            torch.save(partition, os.path.join(out, f"partition_{name}.pt"))
            sd = opt.state_dict()
            flat = {"lr": torch.tensor([sd["param_groups"][0]["lr"]], dtype=torch.float64)}
            for index, values in sd["state"].items():
                for key, value in values.items():
                    flat[f"{index}.{key}"] = torch.as_tensor(value).detach().clone()
            torch.save(flat, os.path.join(out, f"state_{name}.pt"))
        dist.barrier()
    dist.destroy_process_group()


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    torch.save(model().state_dict(), os.path.join(out, "init.pt"))
    torch.save({"x": torch.randn(STEPS, WORLD * PER_RANK, 16),
                "y": torch.randint(0, 4, (STEPS, WORLD * PER_RANK))},
               os.path.join(out, "data.pt"))
    mp.spawn(run, args=(out,), nprocs=WORLD, join=True)
    print("done", *CONFIGS)


if __name__ == "__main__":
    main()
