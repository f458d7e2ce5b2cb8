"""PyTorch's side of format_utils_test: torch.load, torch.distributed.checkpoint
and its format_utils converters, on the state dict both sides build.

Usage: torch_side.py check_torch_save FILE       (torch.load FILE, compare)
       torch_side.py torch_save_to_torch_dcp FILE DIR   (torch's converter, then dcp.load, compare)
       torch_side.py make_torch_dcp DIR FILE     (dcp.save, then torch's dcp_to_torch_save)
Exits 0 when every tensor matches, 1 with a message otherwise.
"""
import sys

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import format_utils


def global_tensor(shape, dtype, start):
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float64) + start).view(shape).to(dtype)


# The same tensors as Expected() in format_utils_test.cc.
def expected():
    return {
        "layer.weight": global_tensor((10, 6), torch.float32, 0),
        "layer.bias": global_tensor((6,), torch.bfloat16, -3),
        "embed": global_tensor((5, 7), torch.float64, 1000),
        "steps": global_tensor((3,), torch.int64, 40),
    }


def compare(got, what):
    want = expected()
    if set(got) != set(want):
        sys.exit(f"{what}: keys {sorted(got)} != {sorted(want)}")
    for k, w in want.items():
        g = got[k]
        if g.dtype != w.dtype or g.shape != w.shape or not torch.equal(g, w):
            sys.exit(f"{what}: {k}: got {g} want {w}")


def main():
    mode = sys.argv[1]
    if mode == "check_torch_save":
        compare(torch.load(sys.argv[2], weights_only=True), "torch.load")
    elif mode == "torch_save_to_torch_dcp":
        format_utils.torch_save_to_dcp(sys.argv[2], sys.argv[3])
        sd = {k: torch.zeros_like(v) for k, v in expected().items()}
        dcp.load(sd, checkpoint_id=sys.argv[3])
        compare(sd, "dcp.load")
    elif mode == "make_torch_dcp":
        dcp.save(expected(), checkpoint_id=sys.argv[2])
        format_utils.dcp_to_torch_save(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
