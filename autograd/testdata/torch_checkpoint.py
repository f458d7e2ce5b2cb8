"""PyTorch's side of autograd/checkpoint_torch_test.cc: gradients of a
two-block MLP with dropout under torch.utils.checkpoint (use_reentrant=False),
flat and nested, and the generator's next draws after backward.

Usage: torch_checkpoint.py SEED

Everything random is drawn as float64 uniforms from the CPU generator
(torch.rand), which Ember draws the same way for the same seed (Note [Random
numbers] in tensor/factories.h): the weights, the input, and the dropout
masks (a uniform >= p keeps an element). Output, one line per tensor:
"<case> <name>: <float.hex values>", cases "flat" and "nested".
"""
import sys

import torch
from torch.utils.checkpoint import checkpoint


def uniform(*shape):
    return torch.rand(*shape, dtype=torch.float64)


def dropout(t, p):
    keep = (uniform(*t.shape) >= p).to(t.dtype)
    return t * (keep * (1.0 / (1.0 - p)))


def params():
    x = (uniform(8, 16) * 2 - 1).requires_grad_()
    w1 = ((uniform(16, 32) * 2 - 1) * 0.3).requires_grad_()
    b1 = (uniform(32) * 0.2 - 0.1).requires_grad_()
    w2 = ((uniform(32, 32) * 2 - 1) * 0.2).requires_grad_()
    b2 = (uniform(32) * 0.2 - 0.1).requires_grad_()
    w3 = ((uniform(32, 4) * 2 - 1) * 0.3).requires_grad_()
    return {"x": x, "w1": w1, "b1": b1, "w2": w2, "b2": b2, "w3": w3}


def run(case, seed):
    torch.manual_seed(seed)
    p = params()

    def block1(t):
        return dropout(torch.tanh(t @ p["w1"] + p["b1"]), 0.25)

    def block2(h):
        return torch.sigmoid(dropout(torch.relu(h @ p["w2"] + p["b2"]), 0.5) @ p["w3"])

    if case == "flat":
        h = checkpoint(block1, p["x"], use_reentrant=False)
        out = checkpoint(block2, h, use_reentrant=False)
    else:
        def both(t):
            return block2(checkpoint(block1, t, use_reentrant=False))
        out = checkpoint(both, p["x"], use_reentrant=False)
    loss = (out * out).sum()
    loss.backward()
    print(f"{case} loss:", loss.item().hex())
    for name, t in p.items():
        print(f"{case} {name}:", *[v.hex() for v in t.grad.flatten().tolist()])
    print(f"{case} next:", *[v.hex() for v in uniform(3).tolist()])


def main():
    seed = int(sys.argv[1])
    for case in ["flat", "nested"]:
        run(case, seed)


if __name__ == "__main__":
    main()
