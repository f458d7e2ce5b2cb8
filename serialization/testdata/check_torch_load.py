#!/usr/bin/python3
"""Checks that PyTorch reads a checkpoint Ember wrote.

usage: check_torch_load.py <checkpoint.pt> <expected.txt>

Loads the file with torch.load(weights_only=True), PyTorch's restricted
loader, and compares it with expected.txt (lines "name dtype sizes values",
as make_fixtures.py writes them): same names in the same order, dtypes,
shapes and values. Exit status 0 when they match, 1 with a message when not,
77 when python3-torch is not installed.
"""
import sys

try:
    import torch
except ImportError:
    print("python3-torch is not installed", file=sys.stderr)
    sys.exit(77)


def main(path, expected_path):
    sd = torch.load(path, weights_only=True)
    expected = []
    with open(expected_path) as f:
        for line in f:
            parts = line.rstrip("\n").split(" ")
            name, dtype, sizes = parts[0], parts[1], parts[2]
            shape = [] if sizes == "-" else [int(s) for s in sizes.split(",")]
            values = [float(v) for v in parts[3:] if v]
            expected.append((name, dtype, shape, values))
    if list(sd.keys()) != [e[0] for e in expected]:
        sys.exit(f"names differ: {list(sd.keys())} vs {[e[0] for e in expected]}")
    for name, dtype, shape, values in expected:
        t = sd[name]
        if str(t.dtype) != "torch." + dtype:
            sys.exit(f"{name}: dtype {t.dtype}, expected {dtype}")
        if list(t.shape) != shape:
            sys.exit(f"{name}: shape {list(t.shape)}, expected {shape}")
        got = [float(v) for v in t.reshape(-1).tolist()]
        if got != values:
            sys.exit(f"{name}: values {got}, expected {values}")
    print(f"torch.load(weights_only=True) read {len(sd)} tensors as expected")


if __name__ == "__main__":
    main(*sys.argv[1:])
