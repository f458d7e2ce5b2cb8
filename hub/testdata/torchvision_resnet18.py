#!/usr/bin/python3
"""Writes torchvision's ResNet-18 (random weights) and its output for one input.

usage: torchvision_resnet18.py <out_dir> [num_classes, default 10]

Writes <out_dir>/resnet18.pt (torch.save of the state_dict, ~45 MB, hence made
at test time rather than committed) and <out_dir>/resnet18.io.txt ("input" and
"output" lines as make_fixtures.py writes them), with the model in eval mode
after one training-mode pass so that the batch-norm running statistics are
not their defaults. <out_dir>/resnet18.hub_name gets the name torchvision
would publish the file under: resnet18-<first 8 hex digits of its SHA-256>.pth.
Exit status 77 when torch or torchvision is missing.
"""
import hashlib
import os
import sys

try:
    import torch
    import torchvision
except ImportError as e:
    print(f"skipping: {e}", file=sys.stderr)
    sys.exit(77)


def main(out_dir, num_classes):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=num_classes)
    model.train()
    with torch.no_grad():
        model(torch.randn(4, 3, 64, 64))  # moves the running statistics
    model.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        y = model(x)
    path = os.path.join(out_dir, "resnet18.pt")
    torch.save(model.state_dict(), path)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(out_dir, "resnet18.hub_name"), "w") as f:
        f.write(f"resnet18-{digest[:8]}.pth")
    with open(os.path.join(out_dir, "resnet18.io.txt"), "w") as f:
        for tag, t in (("input", x), ("output", y)):
            sizes = ",".join(str(s) for s in t.shape)
            f.write(f"{tag} {sizes} " + " ".join(repr(float(v)) for v in t.reshape(-1).tolist()) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 10)
