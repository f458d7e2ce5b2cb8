"""PyTorch's conv2d forward and gradients for nn/conv_onednn_test.cc.

Writes, for each case below, the inputs (x, weight, bias, grad_output, drawn
from a fixed seed) and what torch.nn.functional.conv2d computes from them
(output, grad_input, grad_weight, grad_bias), in float64 from float32 inputs,
as text: a `case` line (name, stride, padding, dilation, groups, bias) and one
`tensor` line per tensor (name, rank, sizes, values). Exits 77 without torch.

  /usr/bin/python3 nn/testdata/conv2d_torch.py OUT.txt
"""
import sys

try:
    import torch
except ImportError:
    sys.exit(77)

# name, (N, C, H, W), O, (kh, kw), stride, padding, dilation, groups, bias
CASES = [
    ("3x3_pad1", (2, 4, 7, 7), 6, (3, 3), (1, 1), (1, 1), (1, 1), 1, True),
    ("5x3_stride2_pad21", (2, 3, 9, 8), 5, (5, 3), (2, 2), (2, 1), (1, 1), 1, False),
    ("stride_uneven", (1, 3, 8, 10), 4, (3, 3), (2, 3), (0, 0), (1, 1), 1, True),
    ("dilation23_pad2", (2, 4, 10, 11), 3, (3, 3), (1, 1), (2, 2), (2, 3), 1, True),
    ("groups2", (2, 6, 6, 6), 4, (3, 3), (1, 1), (1, 1), (1, 1), 2, True),
    ("depthwise", (2, 8, 7, 7), 8, (3, 3), (2, 2), (1, 1), (1, 1), 8, False),
    ("1x1_stride2", (2, 16, 8, 8), 32, (1, 1), (2, 2), (0, 0), (1, 1), 1, False),
    ("7x7_stride2_pad3", (2, 3, 16, 16), 16, (7, 7), (2, 2), (3, 3), (1, 1), 1, False),
    ("blocked_3x3", (2, 32, 8, 8), 48, (3, 3), (1, 1), (1, 1), (1, 1), 1, True),
    ("blocked_3x3_stride2", (3, 64, 8, 8), 64, (3, 3), (2, 2), (1, 1), (1, 1), 1, False),
    ("blocked_groups4_dilation2", (2, 64, 9, 9), 32, (3, 3), (1, 1), (2, 2), (2, 2), 4, True),
    ("spatial_1x1_pad1", (4, 32, 1, 1), 32, (3, 3), (1, 1), (1, 1), (1, 1), 1, False),
    ("one_pixel_stride2_pad1", (3, 32, 2, 2), 48, (3, 3), (2, 2), (1, 1), (1, 1), 1, True),
    ("one_pixel_every_tap", (2, 16, 3, 4), 32, (3, 4), (1, 1), (0, 0), (1, 1), 1, False),
    ("blocked_planes_5x5_to_3x3", (2, 32, 5, 5), 16, (3, 3), (2, 2), (1, 1), (1, 1), 1, True),
    ("blocked_planes_4x4_to_2x2", (2, 16, 4, 4), 32, (1, 1), (2, 2), (0, 0), (1, 1), 1, False),
    ("1x1_stride2_to_one_pixel", (3, 32, 2, 2), 16, (1, 1), (2, 2), (0, 0), (1, 1), 1, True),
    ("1x1_stride32_to_one_pixel", (2, 16, 3, 2), 32, (1, 1), (3, 2), (0, 0), (1, 1), 1, False),
]


def write(out, name, t):
    t = t.detach().double().contiguous()
    values = " ".join(repr(v) for v in t.flatten().tolist())
    out.write(f"tensor {name} {t.dim()} {' '.join(map(str, t.shape))} {values}\n")


def main(path):
    torch.manual_seed(0)
    with open(path, "w") as out:
        for name, xs, o, k, stride, padding, dilation, groups, bias in CASES:
            x = torch.randn(xs, requires_grad=True)
            w = torch.randn((o, xs[1] // groups) + k, requires_grad=True)
            b = torch.randn(o, requires_grad=True) if bias else None
            y = torch.nn.functional.conv2d(x, w, b, stride, padding, dilation, groups)
            gy = torch.randn(y.shape)
            y.backward(gy)
            out.write(f"case {name} {stride[0]} {stride[1]} {padding[0]} {padding[1]} "
                      f"{dilation[0]} {dilation[1]} {groups} {int(bias)}\n")
            write(out, "x", x)
            write(out, "weight", w)
            if bias:
                write(out, "bias", b)
            write(out, "grad_output", gy)
            write(out, "output", y)
            write(out, "grad_input", x.grad)
            write(out, "grad_weight", w.grad)
            if bias:
                write(out, "grad_bias", b.grad)


if __name__ == "__main__":
    main(sys.argv[1])
