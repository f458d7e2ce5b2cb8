"""PyTorch's side of nn/autocast_torch_test.cc.

Usage: torch_autocast.py SEED

1. The policy of each op Ember's autocast table covers (and of some it leaves
   alone), as PyTorch 2.x applies it: the dtype each op returns under
   torch.autocast("cpu") (bfloat16) for float32 and for bfloat16 inputs, and
   whether PyTorch registers an AutocastCUDA kernel for it (its CUDA policy
   cannot run without a GPU; the registration says whether it has one).
   Lines: "policy <name> <dtype from float32> <dtype from bfloat16> <K|->".
2. One training step of a two-layer MLP under CPU autocast (bfloat16), the
   backward outside the region: the loss, the logits' dtype and the
   gradients. Weights and data are float64 uniforms from the seed, cast to
   float32, as the Ember side draws them. Lines: "step <name>: <float.hex>".
"""
import sys

import torch
import torch.nn.functional as F

# name -> (aten overload PyTorch registers the CUDA kernel on, the call on
# args: a [4,4], b [4,4], c [4], d [2,4,4], x [1,3,5,5], w [2,3,3,3]).
OPS = {
    "mm": ("mm", lambda a: a[0].mm(a[1])),
    "bmm": ("bmm", lambda a: a[3].bmm(a[3])),
    "addmm": ("addmm", lambda a: torch.addmm(a[2], a[0], a[1])),
    "dot": ("dot", lambda a: a[2].dot(a[2])),
    "linear": ("linear", lambda a: F.linear(a[0], a[1], a[2])),
    "conv2d": ("conv2d", lambda a: F.conv2d(a[4], a[5])),
    "scaled_dot_product_attention": (
        "scaled_dot_product_attention",
        lambda a: F.scaled_dot_product_attention(a[3], a[3], a[3])),
    "softmax": ("softmax.int", lambda a: a[0].softmax(-1)),
    "log_softmax": ("log_softmax.int", lambda a: a[0].log_softmax(-1)),
    "sum": ("sum", lambda a: a[0].sum()),
    "prod": ("prod", lambda a: a[0].prod()),
    "mean": ("mean", lambda a: a[0].mean()),
    "exp": ("exp", lambda a: a[0].exp()),
    "expm1": ("expm1", lambda a: a[0].expm1()),
    "log": ("log", lambda a: a[0].log()),
    "log1p": ("log1p", lambda a: a[0].log1p()),
    "log2": ("log2", lambda a: a[0].log2()),
    "rsqrt": ("rsqrt", lambda a: a[0].rsqrt()),
    "tan": ("tan", lambda a: a[0].tan()),
    "reciprocal": ("reciprocal", lambda a: a[0].reciprocal()),
    "sqrt": ("sqrt", lambda a: a[0].sqrt()),
    "tanh": ("tanh", lambda a: a[0].tanh()),
    "sigmoid": ("sigmoid", lambda a: a[0].sigmoid()),
    "pow": ("pow.Tensor_Scalar", lambda a: a[0].pow(2.0)),
    "norm": ("norm.Scalar", lambda a: a[0].norm()),
    "layer_norm": ("layer_norm", lambda a: F.layer_norm(a[0], (4,))),
    "batch_norm": ("batch_norm",
                   lambda a: F.batch_norm(a[4], torch.zeros(3), torch.ones(3))),
    "cross_entropy_loss": ("cross_entropy_loss",
                           lambda a: F.cross_entropy(a[0], torch.tensor([0, 1, 2, 3]))),
    "nll_loss": ("nll_loss", lambda a: F.nll_loss(a[0], torch.tensor([0, 1, 2, 3]))),
    "mse_loss": ("mse_loss", lambda a: F.mse_loss(a[0], a[1])),
    "l1_loss": ("l1_loss", lambda a: F.l1_loss(a[0], a[1])),
    "binary_cross_entropy_with_logits": (
        "binary_cross_entropy_with_logits",
        lambda a: F.binary_cross_entropy_with_logits(a[0], a[1] / 2)),
    "cat": ("cat", lambda a: torch.cat([a[0], a[1]])),
    "add": ("add.Tensor", lambda a: a[0] + a[1]),
    "embedding": ("embedding", lambda a: F.embedding(torch.tensor([0, 1]), a[0])),
    "gelu": ("gelu", lambda a: F.gelu(a[0])),
    "relu": ("relu", lambda a: a[0].relu()),
}


def probe_args(dtype):
    shapes = [(4, 4), (4, 4), (4,), (2, 4, 4), (1, 3, 5, 5), (2, 3, 3, 3)]
    return [(torch.rand(*s, dtype=torch.float64) + 0.5).to(dtype) for s in shapes]


def dtype_name(t):
    return str(t.dtype).replace("torch.", "")


def policies():
    for name, (aten, fn) in OPS.items():
        got = []
        for dtype in (torch.float32, torch.bfloat16):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                got.append(dtype_name(fn(probe_args(dtype))))
        table = torch._C._dispatch_dump_table("aten::" + aten)
        cuda = [l for l in table.split("\n") if l.startswith("AutocastCUDA")]
        kernel = "K" if cuda and "fallthrough" not in cuda[0] else "-"
        print("policy", name, got[0], got[1], kernel)


def uniform(*shape):
    return torch.rand(*shape, dtype=torch.float64)


def step():
    x = (uniform(64, 32) * 2 - 1).float()
    target = (uniform(64) * 10).long().clamp(max=9)
    w1 = ((uniform(64, 32) * 2 - 1) * 0.2).float().requires_grad_()
    b1 = ((uniform(64) * 2 - 1) * 0.1).float().requires_grad_()
    w2 = ((uniform(10, 64) * 2 - 1) * 0.2).float().requires_grad_()
    b2 = ((uniform(10) * 2 - 1) * 0.1).float().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = F.linear(F.linear(x, w1, b1).relu(), w2, b2)
        loss = F.cross_entropy(logits, target)
    loss.backward()
    print("step logits_dtype:", 1.0 if logits.dtype == torch.bfloat16 else 0.0)
    print("step loss_dtype:", 1.0 if loss.dtype == torch.float32 else 0.0)
    for name, t in (("loss", loss), ("w1", w1.grad), ("b1", b1.grad), ("w2", w2.grad),
                    ("b2", b2.grad)):
        print("step %s:" % name, " ".join(float(v).hex() for v in t.detach().double().flatten()))


def main():
    torch.manual_seed(int(sys.argv[1]))
    policies()
    torch.manual_seed(int(sys.argv[1]))
    step()


if __name__ == "__main__":
    main()
