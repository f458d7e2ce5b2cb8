"""PyTorch's side of parallel/fsdp_hybrid_test.cc: FSDP (the FSDP1 API,
torch.distributed.fsdp.FullyShardedDataParallel) with HYBRID_SHARD and
_HYBRID_SHARD_ZERO2 on the CPU over gloo, 4 ranks as 2 shard groups of 2
({0, 1}, {2, 3}) replicated across {0, 2} and {1, 3}, given as
process_group=(shard, replicate); fc1 and fc2 are units, fc3 stays in the
root. SGD lr 0.1 momentum 0.9, cross-entropy, each rank on its quarter of
the batch.

Usage: torch_fsdp_hybrid.py OUT_DIR

Writes OUT_DIR/init.pt (the model's starting state_dict), OUT_DIR/data.pt
(x: [steps, 12, 6], y: [steps, 12]) and, per strategy, OUT_DIR/final_<name>.pt
(rank 0's full state dict after the steps) and OUT_DIR/shards_<name>.pt (rank
0's flat shard sizes, root first), then prints "done <names>".
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy, StateDictType

STEPS = 4
LR = 0.1
WORLD = 4
SHARDS = 2
STRATEGIES = {"hybrid": ShardingStrategy.HYBRID_SHARD,
              "hybrid_zero2": ShardingStrategy._HYBRID_SHARD_ZERO2}


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 5)
        self.fc2 = torch.nn.Linear(5, 7)
        self.fc3 = torch.nn.Linear(7, 3)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def run(rank, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(out, "store"),
                            rank=rank, world_size=WORLD)
    # Every rank makes every group, in the same order.
    shard_groups = [dist.new_group([b * SHARDS + i for i in range(SHARDS)])
                    for b in range(WORLD // SHARDS)]
    replicate_groups = [dist.new_group([b * SHARDS + i for b in range(WORLD // SHARDS)])
                        for i in range(SHARDS)]
    groups = (shard_groups[rank // SHARDS], replicate_groups[rank % SHARDS])
    init = torch.load(os.path.join(out, "init.pt"))
    data = torch.load(os.path.join(out, "data.pt"))
    for name, strategy in STRATEGIES.items():
        net = Mlp()
        net.load_state_dict(init)
        fsdp = FSDP(net, process_group=groups, sharding_strategy=strategy,
                    auto_wrap_policy=lambda module, recurse, nonwrapped_numel:
                        recurse or module in (net.fc1, net.fc2),
                    device_id=torch.device("cpu"))
        opt = torch.optim.SGD(fsdp.parameters(), lr=LR, momentum=0.9)
        per = data["x"].shape[1] // WORLD
        for step in range(STEPS):
            x = data["x"][step, rank * per:(rank + 1) * per]
            y = data["y"][step, rank * per:(rank + 1) * per]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(fsdp(x), y).backward()
            opt.step()
        with FSDP.state_dict_type(fsdp, StateDictType.FULL_STATE_DICT,
                                  FullStateDictConfig(rank0_only=False)):
            state = {k: v.clone() for k, v in fsdp.state_dict().items()}
        if rank == 0:
            torch.save(state, os.path.join(out, f"final_{name}.pt"))
            sizes = [p.numel() for p in fsdp.parameters()]
            torch.save({"sizes": torch.tensor(sizes)}, os.path.join(out, f"shards_{name}.pt"))
        dist.barrier()
    dist.destroy_process_group()


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    torch.save(Mlp().state_dict(), os.path.join(out, "init.pt"))
    torch.save({"x": torch.randn(STEPS, 12, 6), "y": torch.randint(0, 3, (STEPS, 12))},
               os.path.join(out, "data.pt"))
    mp.spawn(run, args=(out,), nprocs=WORLD, join=True)
    print("done", *STRATEGIES)


if __name__ == "__main__":
    main()
