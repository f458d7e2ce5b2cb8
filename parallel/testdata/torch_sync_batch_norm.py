"""PyTorch's side of //parallel:sync_batch_norm_torch_test.

  torch_sync_batch_norm.py sync DIR      # DIR/inputs.pt in, DIR/expected.<rank>.pt out
  torch_sync_batch_norm.py convert       # prints torch's converted ResNet-18

`sync`: two processes over gloo (a FileStore in DIR) each hold one rank's
batches of DIR/inputs.pt (written by the Ember test with ember::save) and
compute what torch.nn.SyncBatchNorm gives that rank. torch.nn.SyncBatchNorm
itself refuses CPU tensors once a process group exists (its statistics
kernels are CUDA-only), so each rank all_gathers every rank's batch and
output gradient with torch.distributed and runs torch.nn.BatchNorm{1,2}d on
the concatenation: the output rows and input-gradient rows of its own batch,
the weight and bias gradients of its own rows of the output gradient, and the
running statistics. It also runs torch.nn.SyncBatchNorm with no process group
(where torch falls back to batch norm) on DIR's `fallback` batch, and prints
the ValueError torch.nn.SyncBatchNorm raises for a CPU input in a group.

`convert`: torchvision's resnet18 through
torch.nn.SyncBatchNorm.convert_sync_batchnorm; prints `sync NAME` for every
SyncBatchNorm and `key KEY` for every state_dict key, in order.
"""
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def gather_rows(t):
    """Every rank's `t` (same trailing dims, any number of rows), in rank order."""
    rows = torch.tensor([t.shape[0]])
    sizes = [torch.zeros_like(rows) for _ in range(WORLD)]
    dist.all_gather(sizes, rows)
    most = max(int(s) for s in sizes)
    padded = torch.zeros((most,) + tuple(t.shape[1:]), dtype=t.dtype)
    padded[: t.shape[0]] = t
    parts = [torch.zeros_like(padded) for _ in range(WORLD)]
    dist.all_gather(parts, padded)
    return [p[: int(s)] for p, s in zip(parts, sizes)]


def batch_norm_for(x, options):
    layer = torch.nn.BatchNorm2d if x.dim() == 4 else torch.nn.BatchNorm1d
    return layer(x.shape[1], dtype=x.dtype, **options)


def rank_main(rank, directory):
    dist.init_process_group("gloo", init_method=f"file://{directory}/store", rank=rank,
                            world_size=WORLD)
    inputs = torch.load(f"{directory}/inputs.pt")
    out = {}
    for case in ("image", "rows"):
        steps = int(inputs[f"{case}.steps"])
        momentum = float(inputs[f"{case}.momentum"])
        bn = batch_norm_for(inputs[f"{case}.x.0.0"],
                            {"momentum": None if momentum < 0 else momentum})
        with torch.no_grad():
            bn.weight.copy_(inputs[f"{case}.weight"])
            bn.bias.copy_(inputs[f"{case}.bias"])
        for step in range(steps):
            x = inputs[f"{case}.x.{rank}.{step}"]
            gy = inputs[f"{case}.gy.{rank}.{step}"]
            xs, gys = gather_rows(x), gather_rows(gy)
            first, rows = sum(p.shape[0] for p in xs[:rank]), x.shape[0]
            big_x = torch.cat(xs).requires_grad_()
            big_gy = torch.cat(gys)
            big_y = bn(big_x)
            # Every rank's loss is sum(gy_r * y_r): the input gradient rank r
            # gets is its rows of the gradient of the sum; its weight and bias
            # gradients are those of its own loss.
            mine = torch.zeros_like(big_gy)
            mine[first:first + rows] = gy
            gw, gb = torch.autograd.grad(big_y, [bn.weight, bn.bias], mine, retain_graph=True)
            (gx,) = torch.autograd.grad(big_y, [big_x], big_gy)
            at = f"{case}.{step}"
            out[f"y.{at}"] = big_y[first:first + rows].detach().clone()
            out[f"gx.{at}"] = gx[first:first + rows].clone()
            out[f"gw.{at}"] = gw
            out[f"gb.{at}"] = gb
            out[f"running_mean.{at}"] = bn.running_mean.clone()
            out[f"running_var.{at}"] = bn.running_var.clone()
            out[f"num_batches_tracked.{at}"] = bn.num_batches_tracked.clone()
    torch.save(out, f"{directory}/expected.{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def sync(directory):
    inputs = torch.load(f"{directory}/inputs.pt")
    # No process group: torch.nn.SyncBatchNorm is batch norm.
    x = inputs["fallback.x"].clone().requires_grad_()
    layer = torch.nn.SyncBatchNorm(x.shape[1], dtype=x.dtype)
    y = layer(x)
    (y * inputs["fallback.gy"]).sum().backward()
    fallback = {"fallback.y": y.detach(), "fallback.gx": x.grad,
                "fallback.running_var": layer.running_var.clone()}
    torch.save(fallback, f"{directory}/fallback.pt")
    mp.spawn(rank_main, args=(directory,), nprocs=WORLD, join=True)
    # In a group (even of one), a CPU input is refused.
    dist.init_process_group("gloo", init_method=f"file://{directory}/store1", rank=0,
                            world_size=1)
    try:
        torch.nn.SyncBatchNorm(3)(torch.ones(4, 3))
        print("cpu_refusal none")
    except ValueError as e:
        print(f"cpu_refusal {e}")
    dist.destroy_process_group()


def convert():
    import torchvision
    net = torch.nn.SyncBatchNorm.convert_sync_batchnorm(torchvision.models.resnet18(num_classes=10))
    for name, module in net.named_modules():
        if isinstance(module, torch.nn.SyncBatchNorm):
            print(f"sync {name}")
    for key in net.state_dict():
        print(f"key {key}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "sync":
        sync(sys.argv[2])
    else:
        convert()
