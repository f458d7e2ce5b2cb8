#!/usr/bin/python3
"""Writes torchvision's ResNet-18 (random weights) and its output for one input.

usage: torchvision_resnet18.py <out_dir>

Writes <out_dir>/resnet18.pt (torch.save of the state_dict, ~45 MB, hence made
at test time rather than committed) and <out_dir>/resnet18.io.txt ("input" and
"output" lines as make_fixtures.py writes them), with the model in eval mode
after one training-mode pass so that the batch-norm running statistics are
not their defaults. Exit status 77 when torch or torchvision is missing.
"""
import os
import sys

try:
    import torch
    import torchvision
except ImportError as e:
    print(f"skipping: {e}", file=sys.stderr)
    sys.exit(77)


def main(out_dir):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    model.train()
    with torch.no_grad():
        model(torch.randn(4, 3, 64, 64))  # moves the running statistics
    model.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        y = model(x)
    torch.save(model.state_dict(), os.path.join(out_dir, "resnet18.pt"))
    with open(os.path.join(out_dir, "resnet18.io.txt"), "w") as f:
        for tag, t in (("input", x), ("output", y)):
            sizes = ",".join(str(s) for s in t.shape)
            f.write(f"{tag} {sizes} " + " ".join(repr(float(v)) for v in t.reshape(-1).tolist()) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
