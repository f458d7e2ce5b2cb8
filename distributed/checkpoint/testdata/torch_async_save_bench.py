"""PyTorch's side of async_save_benchmark.cc: the same loop (a 64 MiB state
of 8 float32 tensors of 8 MiB, four 512x512 products and an in-place update
of every state tensor per step), timed without checkpoints, with
torch.distributed.checkpoint.save and with dcp.async_save (waiting for the
previous save's future before the next, and for the last inside the time;
no checkpoint after the last step).

Usage: torch_async_save_bench.py DIR [--steps 200] [--every 50] [--rounds 3]
"""
import argparse
import os
import shutil
import time

import torch
import torch.distributed.checkpoint as dcp


def loop(mode, state, a, steps, every, out, rnd):
    pending = None
    start = time.perf_counter()
    for step in range(1, steps + 1):
        x = a
        for _ in range(4):
            x = (x @ a) * 0.01
        inc = x[0:1].mean().item() + 1e-3
        for t in state:
            t.add_(inc)
        if mode == "none" or step % every or step == steps:
            continue
        sd = {f"layers.{i}.weight": t for i, t in enumerate(state)}
        path = os.path.join(out, f"{mode[0]}{rnd}_{step}")
        if mode == "save":
            dcp.save(sd, checkpoint_id=path)
        else:
            if pending is not None:
                pending.result()
            pending = dcp.async_save(sd, checkpoint_id=path)
    if pending is not None:
        pending.result()
    return time.perf_counter() - start


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(2)
    out = os.path.join(args.dir, f"torch_async_{os.getpid()}")
    os.makedirs(out, exist_ok=True)
    state = [torch.randn(2048, 1024) for _ in range(8)]
    a = torch.randn(512, 512)
    n = (args.steps - 1) // args.every
    print(f"torch {torch.__version__}: state 64 MiB, {args.steps} steps, a checkpoint every "
          f"{args.every} ({n} per loop)")
    loop("async", state, a, args.every, args.every, out, -1)
    for rnd in range(args.rounds):
        none = loop("none", state, a, args.steps, args.every, out, rnd)
        sync = loop("save", state, a, args.steps, args.every, out, rnd)
        asyn = loop("async", state, a, args.steps, args.every, out, rnd)
        print(f"round {rnd}: loop {none:.3f} s; save {sync:.3f} s (lost "
              f"{(sync - none) / n * 1e3:.1f} ms per checkpoint); async_save {asyn:.3f} s (lost "
              f"{(asyn - none) / n * 1e3:.1f} ms per checkpoint, "
              f"{100 * (asyn - none) / (sync - none):.1f}% of save's)", flush=True)
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
