"""PyTorch 2.x's side of checkpoint_benchmark: the same state (8 float32
tensors of 2048 x 1024, 64 MiB) through torch.save / torch.load and
torch.distributed.checkpoint (one process, FileSystemWriter's defaults:
sync_files=True) into DIR. Prints the median of ROUNDS rounds per case, in
MB/s (10^6 bytes, as Google Benchmark's M).

Usage: torch_bench.py DIR [ROUNDS]
"""
import os
import shutil
import statistics
import sys
import time

import torch
import torch.distributed.checkpoint as dcp


def main():
    out = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    state = {f"layers.{i}.weight": torch.randn(2048, 1024) for i in range(8)}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    pt = os.path.join(out, "state.pt")

    def save_pt():
        torch.save(state, pt)

    def load_pt():
        torch.load(pt, weights_only=True)

    def save_dcp():
        d = os.path.join(out, "dcp")
        shutil.rmtree(d, ignore_errors=True)
        dcp.save(state, checkpoint_id=d)

    def load_dcp():
        target = {k: torch.empty_like(v) for k, v in state.items()}
        dcp.load(target, checkpoint_id=os.path.join(out, "dcp"))

    cases = [("torch.save", save_pt), ("torch.load", load_pt), ("dcp.save", save_dcp),
             ("dcp.load (in place)", load_dcp)]
    times = {name: [] for name, _ in cases}
    save_pt()
    save_dcp()
    for _ in range(rounds):  # interleaved rounds
        for name, fn in cases:
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    print(f"torch {torch.__version__}, {nbytes / 2**20:.0f} MiB, median of {rounds} rounds")
    for name, _ in cases:
        med = statistics.median(times[name])
        print(f"{name:22s} {med * 1e3:8.1f} ms {nbytes / med / 1e6:8.0f} MB/s")


if __name__ == "__main__":
    main()
