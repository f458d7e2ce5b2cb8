"""PyTorch's side of parallel/tensor_parallel_torch_test.cc: tensor
parallelism (torch.distributed.tensor.parallel) on the CPU over gloo, at
TP=2 and TP=4, on the models of parallel/tensor_parallel_testing.h.

Usage: torch_tp.py OUT_DIR

Writes OUT_DIR/init_<model>.pt (the whole model's state_dict, written by
torch) and OUT_DIR/input_<model>.pt (x, w and, for the loss, target); runs
each model's plan at each TP size and writes OUT_DIR/out_<model>_<tp>.pt:
"y" (the whole output, or the loss), "x_grad" and "grad.<name>" (each
parameter's whole gradient, DTensor.full_tensor()). Prints "done" at the end,
or "unsupported <reason>" when torch's tensor parallelism can't run here.

Models: mlp (Linear(8, 16) -> GELU -> Linear(16, 8), Colwise/Rowwise), block
(a pre-LayerNorm transformer block: Colwise q/k/v/fc1, Rowwise o/fc2),
block_sp (the same with SequenceParallel LayerNorms; input and output
sharded along the sequence) and loss (Linear(8, 12) Colwise with
use_local_output=False and cross_entropy under loss_parallel()).

The sizes divide by 4: torch's styles read a plain local tensor as an even
shard (from_local without a shape), so an uneven hidden width fails in torch
at TP=4 (Linear(8, 10) -> Linear(10, 8): "a and b must have same reduction
dim, but got [4, 12] X [10, 8]"); Ember's tests cover uneven shards alone.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel,
                                               loss_parallel, parallelize_module)

SIZES = (2, 4)


class Attention(torch.nn.Module):
    def __init__(self, dim, head_dim, causal=False):
        super().__init__()
        self.head_dim = head_dim
        self.causal = causal
        self.q = torch.nn.Linear(dim, dim)
        self.k = torch.nn.Linear(dim, dim)
        self.v = torch.nn.Linear(dim, dim)
        self.o = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s = x.shape[0], x.shape[1]

        def heads(t):
            return t.reshape(b, s, t.shape[2] // self.head_dim, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.o(a.transpose(1, 2).reshape(b, s, q.shape[1] * self.head_dim))


class Block(torch.nn.Module):
    def __init__(self, dim, head_dim, hidden, causal=False):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(dim)
        self.attn = Attention(dim, head_dim, causal)
        self.ln2 = torch.nn.LayerNorm(dim)
        self.fc1 = torch.nn.Linear(dim, hidden)
        self.fc2 = torch.nn.Linear(hidden, dim)

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.fc2(F.gelu(self.fc1(self.ln2(h))))


def make(name):
    if name == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                                   torch.nn.Linear(16, 8))
    if name == "loss":
        return torch.nn.Linear(8, 12)
    return Block(8, 2, 16)


def plan(name):
    if name == "mlp":
        return {"0": ColwiseParallel(), "2": RowwiseParallel()}
    if name == "loss":
        return ColwiseParallel(use_local_output=False)
    if name == "block":
        return {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
                "attn.v": ColwiseParallel(), "attn.o": RowwiseParallel(),
                "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    return {"ln1": SequenceParallel(),
            "attn": PrepareModuleInput(input_layouts=(Shard(1),),
                                       desired_input_layouts=(Replicate(),)),
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(), "attn.o": RowwiseParallel(output_layouts=Shard(1)),
            "ln2": SequenceParallel(),
            "fc1": ColwiseParallel(input_layouts=Shard(1)),
            "fc2": RowwiseParallel(output_layouts=Shard(1))}


MODELS = ("mlp", "block", "block_sp", "loss")


def write_inputs(out):
    torch.manual_seed(0)
    for name in MODELS:
        model = make(name)
        torch.save(model.state_dict(), os.path.join(out, f"init_{name}.pt"))
        if name == "mlp":
            data = {"x": torch.randn(4, 8), "w": torch.randn(4, 8)}
        elif name == "loss":
            data = {"x": torch.randn(6, 8), "target": torch.tensor([3, 11, 0, -100, 5, 7])}
        else:
            data = {"x": torch.randn(2, 4, 8), "w": torch.randn(2, 4, 8)}
        torch.save(data, os.path.join(out, f"input_{name}.pt"))


def plain(t):
    """A plain CPU tensor of `t`'s values (outputs of functional collectives
    are AsyncCollectiveTensors, which a state_dict reader need not know)."""
    t = t.detach()
    if hasattr(t, "wait") and type(t) is not torch.Tensor:
        t = t.wait()
    return torch.from_numpy(t.numpy().copy())


def chunk(t, dim, n, r):
    pieces = list(torch.chunk(t, n, dim))
    return pieces[r] if r < len(pieces) else t.narrow(dim, 0, 0)


def run(rank, world, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + os.path.join(out, f"store{world}"),
                            rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    for name in MODELS:
        model = make(name)
        model.load_state_dict(torch.load(os.path.join(out, f"init_{name}.pt")))
        data = torch.load(os.path.join(out, f"input_{name}.pt"))
        model = parallelize_module(model, mesh, plan(name))
        x = data["x"].clone()
        if name == "block_sp":
            x = chunk(x, 1, world, rank).contiguous()
        x.requires_grad_(True)
        result = {}
        if name == "loss":
            logits = model(x)
            with loss_parallel():
                loss = F.cross_entropy(logits, data["target"])
                (loss * loss).sum().backward()
            result["y"] = loss.full_tensor().detach()
        else:
            y = model(x)
            w = data["w"]
            if name == "block_sp":
                w = chunk(w, 1, world, rank)
            (y * w).sum().backward()
            if name == "block_sp":
                pieces = [torch.empty_like(y) for _ in range(world)]
                dist.all_gather(pieces, y.detach().contiguous())
                result["y"] = torch.cat(pieces, 1)
            else:
                result["y"] = y.detach()
        if name == "block_sp":
            pieces = [torch.empty_like(x.grad) for _ in range(world)]
            dist.all_gather(pieces, x.grad.contiguous())
            result["x_grad"] = torch.cat(pieces, 1)
        else:
            result["x_grad"] = x.grad
        for pname, p in model.named_parameters():
            g = p.grad
            result["grad." + pname] = g.full_tensor() if hasattr(g, "full_tensor") else g
        result = {k: plain(v) for k, v in result.items()}
        if rank == 0:
            torch.save(result, os.path.join(out, f"out_{name}_{world}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    write_inputs(out)
    for world in SIZES:
        try:
            mp.start_processes(run, args=(world, out), nprocs=world, join=True,
                               start_method="fork")
        except Exception as e:  # torch's TP refused to run here: say why
            print("unsupported", repr(e).replace("\n", " ")[:2000])
            return
    print("done")


if __name__ == "__main__":
    main()
