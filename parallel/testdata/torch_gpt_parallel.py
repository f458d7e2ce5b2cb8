"""PyTorch's side of parallel/gpt_parallel_torch_test.cc: the small GPT of
parallel/gpt_parallel_testing.h (causal) trained in each layout of model parallelism
with PyTorch 2.x on the CPU over gloo: torch.distributed.tensor.parallel
(TP=2), torch.distributed.pipelining (GPipe, 1F1B, Interleaved1F1B,
InterleavedZeroBubble on 2 ranks) and FSDP2's fully_shard over "dp" with
tensor parallelism over "tp" on a 2 x 2 mesh. SGD lr 0.1 momentum 0.9,
STEPS steps on batches of 8 sequences of 4 tokens; mean cross-entropy
against the next tokens.

Usage: torch_gpt_parallel.py OUT_DIR

Writes OUT_DIR/init.pt (the whole model's state_dict, "0.wte.weight"...),
OUT_DIR/data.pt (tokens and targets, int64 [STEPS, 8, 4]) and, per layout,
OUT_DIR/final_<layout>_rank<r>.pt: the whole values (full_tensor() of
sharded parameters) of the parameters rank r trained. Prints "done".
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                          ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble)
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_tp import Block  # noqa: E402  the block Ember's tests share

VOCAB, DIM, HEAD_DIM, HIDDEN, SEQ, LAYERS = 16, 8, 2, 16, 4, 2
STEPS, BATCH, MICROBATCHES = 3, 8, 4
LAYOUTS = ("tp", "pp_gpipe", "pp_1f1b", "pp_interleaved", "pp_zero_bubble", "fsdp_tp")


class Embeddings(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, DIM)
        self.wpe = torch.nn.Embedding(SEQ, DIM)

    def forward(self, tokens):
        return self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))


def make_gpt():
    return torch.nn.Sequential(Embeddings(), *[Block(DIM, HEAD_DIM, HIDDEN, causal=True) for _ in range(LAYERS)],
                               torch.nn.LayerNorm(DIM), torch.nn.Linear(DIM, VOCAB))


def tp_plan():
    plan = {"0.wte": RowwiseParallel(input_layouts=Replicate())}
    for i in range(1, LAYERS + 1):
        for name in ("attn.q", "attn.k", "attn.v", "fc1"):
            plan[f"{i}.{name}"] = ColwiseParallel()
        for name in ("attn.o", "fc2"):
            plan[f"{i}.{name}"] = RowwiseParallel()
    plan[str(LAYERS + 2)] = ColwiseParallel(output_layouts=Replicate())
    return plan


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def whole(t):
    t = t.detach()
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return torch.from_numpy(t.numpy().copy())


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def train_steps(model, data, rows=None):
    """TP or FSDP x TP: every rank runs the whole model on its rows (all by default)."""
    opt = sgd(model.parameters())
    for step in range(STEPS):
        opt.zero_grad()
        x, y = data["tokens"][step], data["targets"][step]
        if rows is not None:
            x, y = x[rows], y[rows]
        loss_fn(model(x), y).backward()
        opt.step()
    return {name: whole(p) for name, p in model.named_parameters()}


def train_pipeline(layout, rank, model, data):
    children = len(model)
    if layout in ("pp_interleaved", "pp_zero_bubble"):
        bounds = list(range(LAYERS + 2)) + [children]  # one child a stage, norm and head together
    else:
        bounds = [0, 2, children]
    num_stages = len(bounds) - 1
    ids = list(range(rank, num_stages, 2))
    parts = {s: torch.nn.Sequential(*[model[i] for i in range(bounds[s], bounds[s + 1])])
             for s in ids}
    stages = [PipelineStage(parts[s], s, num_stages, torch.device("cpu")) for s in ids]
    if layout == "pp_gpipe":
        sched = ScheduleGPipe(stages[0], MICROBATCHES, loss_fn=loss_fn)
    elif layout == "pp_1f1b":
        sched = Schedule1F1B(stages[0], MICROBATCHES, loss_fn=loss_fn)
    elif layout == "pp_interleaved":
        sched = ScheduleInterleaved1F1B(stages, MICROBATCHES, loss_fn=loss_fn)
    else:
        sched = ScheduleInterleavedZeroBubble(stages, MICROBATCHES, loss_fn=loss_fn)
    opt = sgd([p for s in ids for p in parts[s].parameters()])
    first, last = 0 in ids, num_stages - 1 in ids
    for step in range(STEPS):
        opt.zero_grad()
        if first:
            sched.step(data["tokens"][step])
        else:
            sched.step(target=data["targets"][step] if last else None)
        opt.step()
    final = {}
    for s in ids:
        for i in range(bounds[s], bounds[s + 1]):
            for name, p in model[i].named_parameters():
                final[f"{i}.{name}"] = whole(p)
    return final


def run(rank, world, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(out, f"store{world}"),
                            rank=rank, world_size=world)
    init = torch.load(os.path.join(out, "init.pt"))
    data = torch.load(os.path.join(out, "data.pt"))
    for layout in LAYOUTS:
        if (layout == "fsdp_tp") != (world == 4):
            continue
        model = make_gpt()
        model.load_state_dict(init)
        if layout == "tp":
            mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
            model = parallelize_module(model, mesh, tp_plan())
            final = train_steps(model, data)
        elif layout == "fsdp_tp":
            mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
            model = parallelize_module(model, mesh["tp"], tp_plan())
            for i in range(1, LAYERS + 1):
                fully_shard(model[i], mesh=mesh["dp"])
            fully_shard(model, mesh=mesh["dp"])
            d = mesh["dp"].get_local_rank()
            half = BATCH // 2
            final = train_steps(model, data, slice(d * half, (d + 1) * half))
        else:
            final = train_pipeline(layout, rank, model, data)
        torch.save(final, os.path.join(out, f"final_{layout}_rank{rank}.pt"))
        dist.barrier()
    dist.destroy_process_group()


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(11)
    torch.save(make_gpt().state_dict(), os.path.join(out, "init.pt"))
    text = torch.randint(0, VOCAB, (STEPS, BATCH, SEQ + 1))
    torch.save({"tokens": text[:, :, :SEQ].contiguous(), "targets": text[:, :, 1:].contiguous()},
               os.path.join(out, "data.pt"))
    for world in (2, 4):
        mp.start_processes(run, args=(world, out), nprocs=world, join=True, start_method="fork")
    print("done")


if __name__ == "__main__":
    main()
