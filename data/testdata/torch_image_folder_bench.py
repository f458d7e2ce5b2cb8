"""PyTorch's side of data/image_folder_benchmark.cc, and the images both
read.

    python3 torch_image_folder_bench.py --root DIR --make [--images 1024]
        writes DIR/<class>/<n>.jpg: 10 classes of 500 x 375 JPEGs (quality
        90; smooth colour fields with noise, as photographs decode)
    python3 torch_image_folder_bench.py --root DIR [--workers 0,1,2] [--repeats 2]
        torchvision's ImageFolder with RandomResizedCrop(224),
        RandomHorizontalFlip(), ToTensor(), Normalize(ImageNet's), batches of
        64, shuffled: images per second over an epoch after its first batch,
        best of --repeats
"""
import argparse
import os
import time

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


def make(root, images):
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:375, 0:500].astype(np.float32)
    for i in range(images):
        c = rng.uniform(0, 1, size=(3, 3))
        base = np.stack([c[k, 0] * 255 * xx / 500 + c[k, 1] * 255 * yy / 375 * (1 - c[k, 0])
                         + c[k, 2] * 40 * np.sin(xx / (7 + 13 * c[k, 2])) for k in range(3)], -1)
        noisy = np.clip(base + rng.normal(0, 12, size=base.shape), 0, 255).astype(np.uint8)
        d = os.path.join(root, f"class{i % 10}")
        os.makedirs(d, exist_ok=True)
        Image.fromarray(noisy).save(os.path.join(d, f"{i}.jpg"), quality=90)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--make", action="store_true")
    p.add_argument("--images", type=int, default=1024)
    p.add_argument("--workers", default="0,1,2")
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args()
    if a.make:
        make(a.root, a.images)
        return
    t = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    ds = datasets.ImageFolder(a.root, transform=t)
    print(f"{len(ds)} images, batches of 64")
    for w in [int(x) for x in a.workers.split(",")]:
        best = 0.0
        for _ in range(a.repeats):
            it = iter(DataLoader(ds, batch_size=64, shuffle=True, num_workers=w))
            first = next(it)
            assert first[0].shape == (64, 3, 224, 224)
            n = 0
            start = time.perf_counter()
            for x, _ in it:
                n += x.shape[0]
            best = max(best, n / (time.perf_counter() - start))
            del it
        print(f"workers {w}: {best:.1f} images/s")


if __name__ == "__main__":
    main()
