"""PyTorch's side of data/dataloader_benchmark.cc: the same dataset (get()
returns a ready 3x224x224 float32 tensor), batches, worker counts and
timing, for torch.utils.data.DataLoader.

    python3 torch_loader_bench.py [--workers 0,1,2] [--batches 200]
        [--batch 64] [--repeats 3]
"""
import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Ready(Dataset):
    def __init__(self, n):
        self.n = n
        self.image = torch.randn(3, 224, 224)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.image


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", default="0,1,2")
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    ds = Ready(a.batches * a.batch)
    print(f"batch {a.batch} of 3x224x224 float32, {a.batches} batches")
    for w in [int(x) for x in a.workers.split(",")]:
        best = 0.0
        for _ in range(a.repeats):
            it = iter(DataLoader(ds, batch_size=a.batch, num_workers=w))
            warm = 2 * max(w, 1)
            first = next(it)
            assert first.shape == (a.batch, 3, 224, 224) and torch.equal(first[-1], ds.image)
            for _ in range(warm - 1):
                next(it)
            timed = a.batches - warm
            start = time.perf_counter()
            for _ in range(timed):
                next(it)
            best = max(best, timed / (time.perf_counter() - start))
            del it
        print(f"workers {w}: {best:.1f} batches/s")


if __name__ == "__main__":
    main()
