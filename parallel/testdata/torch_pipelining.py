"""PyTorch's side of parallel/pipelining_torch_test.cc: torch.distributed.pipelining
on the CPU over gloo, 2 ranks, an MLP of 4 Linear(8, 8) layers with ReLUs
between them, mse_loss (mean) per microbatch, scale_grads as torch's default,
SGD lr 0.1, STEPS steps on batches of 16 rows in 4 even microbatches
(an uneven split fails in torch 2.15 across stages: its receive buffers keep
microbatch 0's shape, so mse_loss sees 3 rows against a target of 2).

Usage: torch_pipelining.py OUT_DIR

Writes OUT_DIR/init.pt ({"layer<i>.weight", "layer<i>.bias"}: the model's
starting parameters), OUT_DIR/data.pt (x, y: [STEPS, 16, 8]) and, per
schedule <name> (gpipe, 1f1b: one stage of 2 layers per rank; interleaved and
zero_bubble: ScheduleInterleaved1F1B and ScheduleInterleavedZeroBubble, 4
stages of one layer, 2 per rank):
  final_<name>_rank<r>.pt  rank r's layers after the steps, "layer<i>.weight"...;
  losses_<name>.pt         {"step<s>": the 4 microbatch losses} from the rank
                           holding the last stage.
Prints "done".
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                          ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble)

WORLD = 2
LAYERS = 4
WIDTH = 8
STEPS = 3
ROWS = 16
MICROBATCHES = 4


def part(init, first, last):
    mods = []
    for i in range(first, last):
        lin = torch.nn.Linear(WIDTH, WIDTH)
        with torch.no_grad():
            lin.weight.copy_(init[f"layer{i}.weight"])
            lin.bias.copy_(init[f"layer{i}.bias"])
        mods.append(lin)
        if i + 1 < LAYERS:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods)


def linears(seq):
    return [m for m in seq if isinstance(m, torch.nn.Linear)]


def run(rank, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(out, "store"),
                            rank=rank, world_size=WORLD)
    init = torch.load(os.path.join(out, "init.pt"))
    data = torch.load(os.path.join(out, "data.pt"))
    for name in ("gpipe", "1f1b", "interleaved", "zero_bubble"):
        if name in ("interleaved", "zero_bubble"):
            stage_ids = [rank, rank + WORLD]
            per = LAYERS // (2 * WORLD)
            num_stages = 2 * WORLD
        else:
            stage_ids = [rank]
            per = LAYERS // WORLD
            num_stages = WORLD
        parts = {s: part(init, s * per, (s + 1) * per) for s in stage_ids}
        stages = [PipelineStage(parts[s], s, num_stages, torch.device("cpu")) for s in stage_ids]
        loss_fn = torch.nn.functional.mse_loss
        if name == "gpipe":
            sched = ScheduleGPipe(stages[0], MICROBATCHES, loss_fn=loss_fn)
        elif name == "1f1b":
            sched = Schedule1F1B(stages[0], MICROBATCHES, loss_fn=loss_fn)
        elif name == "interleaved":
            sched = ScheduleInterleaved1F1B(stages, MICROBATCHES, loss_fn=loss_fn)
        else:
            sched = ScheduleInterleavedZeroBubble(stages, MICROBATCHES, loss_fn=loss_fn)
        params = [p for s in stage_ids for p in parts[s].parameters()]
        opt = torch.optim.SGD(params, lr=0.1)
        has_last = (num_stages - 1) in stage_ids
        record = {}
        for step in range(STEPS):
            opt.zero_grad()
            losses = []
            if rank == 0:
                sched.step(data["x"][step])
            else:
                sched.step(target=data["y"][step], losses=losses)
            if has_last:
                record[f"step{step}"] = torch.stack([l.detach() for l in losses])
            opt.step()
        final = {}
        for s in stage_ids:
            for j, lin in enumerate(linears(parts[s])):
                i = s * per + j
                final[f"layer{i}.weight"] = lin.weight.detach().clone()
                final[f"layer{i}.bias"] = lin.bias.detach().clone()
        torch.save(final, os.path.join(out, f"final_{name}_rank{rank}.pt"))
        if has_last:
            torch.save(record, os.path.join(out, f"losses_{name}.pt"))
        dist.barrier()
    dist.destroy_process_group()


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(7)
    init = {}
    for i in range(LAYERS):
        lin = torch.nn.Linear(WIDTH, WIDTH)
        init[f"layer{i}.weight"] = lin.weight.detach().clone()
        init[f"layer{i}.bias"] = lin.bias.detach().clone()
    torch.save(init, os.path.join(out, "init.pt"))
    torch.save({"x": torch.randn(STEPS, ROWS, WIDTH), "y": torch.randn(STEPS, ROWS, WIDTH)},
               os.path.join(out, "data.pt"))
    mp.spawn(run, args=(out,), nprocs=WORLD)
    print("done")


if __name__ == "__main__":
    main()
