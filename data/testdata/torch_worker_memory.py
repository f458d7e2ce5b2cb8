"""PyTorch's side of data/worker_memory_benchmark.cc: the same dataset (one
float32 tensor of --gib GiB, rows of 16,384 values), persistent workers
through one shuffled epoch in batches of 64, then each worker's resident and
private memory from /proc/<pid>/smaps_rollup. --layout=list keeps the rows
as a Python list of numpy arrays instead (a dataset of many Python objects,
whose reference counts the workers write).

    python3 torch_worker_memory.py [--gib 2] [--workers 1,2,4] [--layout tensor|list]
"""
import argparse
import os

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

ROW = 16384


class Rows(Dataset):
    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i], os.getpid()


def memory(pid):
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                out[parts[0].rstrip(":")] = int(parts[1])
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gib", type=float, default=2)
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--layout", default="tensor", choices=["tensor", "list"])
    a = p.parse_args()
    rows = int(a.gib * (1 << 30) / (ROW * 4))
    if a.layout == "tensor":
        data = torch.ones(rows, ROW)
    else:
        data = [np.ones(ROW, dtype=np.float32) for _ in range(rows)]
    mb = rows * ROW * 4 / 1e6
    print(f"dataset ({a.layout}): {rows} rows of {ROW} float32, {mb:.0f} MB")
    for w in [int(x) for x in a.workers.split(",")]:
        loader = DataLoader(Rows(data), batch_size=64, shuffle=True, num_workers=w,
                            persistent_workers=True)
        pids = set()
        for _, pid in loader:
            pids.add(int(pid[0]))
        rss = priv = 0.0
        for pid in pids:
            m = memory(pid)
            rss += m["Rss"] / 1e3
            priv += (m["Private_Clean"] + m["Private_Dirty"]) / 1e3
        n = len(pids)
        print(f"workers {w}: per worker resident {rss / n:.1f} MB, private {priv / n:.1f} MB "
              f"({100 * priv / n / mb:.2f}% of the dataset)")
        del loader


if __name__ == "__main__":
    main()
