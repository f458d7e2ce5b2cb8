#!/usr/bin/python3
"""Makes the hub's model fixtures in this folder with Debian's python3-torch.

Run once from the repository root: /usr/bin/python3 hub/testdata/make_fixtures.py
The outputs are committed; the tests only read them.

  mlp_torch.pt, small_cnn_torch.pt   state_dicts of the hub's "mlp" and
                        "small_cnn" architectures built with torch.nn, and
  *_torch.io.txt        an input and PyTorch's output for it ("input" and
                        "output" lines: sizes then values), so tests compare
                        Ember's forward with PyTorch's
"""
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def write_io(path, x, y):
    with open(path, "w") as f:
        for tag, t in (("input", x), ("output", y)):
            sizes = ",".join(str(s) for s in t.shape)
            f.write(f"{tag} {sizes} " + " ".join(repr(float(v)) for v in t.reshape(-1).tolist()) + "\n")


def models():
    """The hub's builder architectures, as torch.nn spells them."""
    nn = torch.nn
    torch.manual_seed(1)
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    x = torch.randn(5, 4)
    torch.save(mlp.state_dict(), os.path.join(HERE, "mlp_torch.pt"))
    write_io(os.path.join(HERE, "mlp_torch.io.txt"), x, mlp(x).detach())
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                        nn.Flatten(), nn.Linear(16, 4))
    x = torch.randn(2, 3, 8, 8)
    torch.save(cnn.state_dict(), os.path.join(HERE, "small_cnn_torch.pt"))
    write_io(os.path.join(HERE, "small_cnn_torch.io.txt"), x, cnn(x).detach())


if __name__ == "__main__":
    models()
