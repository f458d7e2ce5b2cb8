"""PyTorch's side of multiprocessing/cuda_queue_benchmark.cc, on the same GPU.

The protocol, the same on both sides: a child started with the spawn method
(CUDA cannot be used in a process forked after its parent initialised it)
takes float32 CUDA tensors from one Queue and answers on another. Each round
trip, the parent makes a fresh tensor on cuda:0 (zeros) and puts it; the child
gets it (CUDA IPC: the same device memory) and then
  ack:  adds 1 in place, synchronises its stream, drops the tensor and puts
        an ack (the element count);
  echo: puts back a CUDA tensor of its own, t + 1 (a CUDA tensor received
        from another process cannot be sent on), which the parent gets and
        drops.
Five checked round trips first (the values the other process wrote must
arrive), then `iters` timed ones. Around the timed ones, both processes count
what could leak (after torch.cuda.ipc_collect()): CUDA memory allocated,
open descriptors, memory mappings (/proc/self/maps lines) and /dev/shm
entries.

Prints one line per figure, `figure <name> <value> <unit>`, e.g.
  figure torch_cuda_queue_ack_64MiB 1234.5 round_trips/s
  figure torch_cuda_queue_ack_64MiB_parent_d_fds 0 fds
and, where torch has no usable CUDA device, one line `SKIP torch_cuda_queue.py:
<why>` and exit status 0.

  python3 multiprocessing/torch_cuda_queue.py                  # every case
  python3 multiprocessing/torch_cuda_queue.py --mode ack --bytes 67108864 --iters 2000

The C++ benchmark runs the second form for each of its cases when
EMBER_TORCH_PEER names this file. --device cpu runs the same protocol over
shared memory (figures torch_cpu_queue_*), to check the script without a GPU.
"""
import argparse
import os
import queue
import sys
import time

try:
    import torch
    import torch.multiprocessing as mp
except ImportError as e:  # no torch at all: nothing to compare against
    if __name__ == "__main__":
        print(f"SKIP torch_cuda_queue.py: python3 cannot import torch ({e})")
        sys.exit(0)
    raise

SIZES = (4 << 10, 1 << 20, 64 << 20)
# The C++ benchmark's message counts: 10,000 for 4 KiB (the leak figure).
ITERS = {4 << 10: 10000, 1 << 20: 2500, 64 << 20: 2000}
MODES = ("ack", "echo")
WARMUP = 5
TIMEOUT_S = 60
REPORT = "report"  # asks the child for its counts


def size_name(nbytes):
    if nbytes % (1 << 20) == 0:
        return f"{nbytes >> 20}MiB"
    if nbytes % (1 << 10) == 0:
        return f"{nbytes >> 10}KiB"
    return f"{nbytes}B"


def resources():
    """(descriptors, mappings, /dev/shm entries) of this process."""
    fds = len(os.listdir("/proc/self/fd"))
    with open("/proc/self/maps") as f:
        maps = sum(1 for _ in f)
    try:
        shm = len(os.listdir("/dev/shm"))
    except OSError:
        shm = 0
    return fds, maps, shm


def child(q_in, q_out, mode):
    cuda = None  # the device of the first tensor tells
    while True:
        msg = q_in.get(timeout=TIMEOUT_S)
        if msg is None:
            return
        if isinstance(msg, str):  # REPORT
            if cuda:
                torch.cuda.ipc_collect()
            fds, maps, _ = resources()
            q_out.put((fds, maps, torch.cuda.memory_allocated(0) if cuda else 0))
            continue
        cuda = msg.is_cuda
        if mode == "ack":
            msg.add_(1)
            if cuda:
                torch.cuda.synchronize()
            n = msg.numel()
            del msg  # the parent's block is released before the ack
            q_out.put(n)
        else:
            back = msg + 1
            del msg
            q_out.put(back)
            del back


def bench(mode, nbytes, iters, device="cuda"):
    """Round trips per second for one case, and the counts around them.
    device "cpu" runs the same protocol over shared memory (to check the
    script where no GPU is)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
    if nbytes <= 0 or nbytes % 4 != 0:
        raise ValueError(f"--bytes {nbytes}: expected a positive multiple of 4 (float32)")
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=child, args=(q_in, q_out, mode), daemon=True)
    proc.start()
    dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    cuda = dev.type == "cuda"

    def collect_and_count():
        if cuda:
            torch.cuda.ipc_collect()
            torch.cuda.synchronize()
        return resources() + (torch.cuda.memory_allocated(0) if cuda else 0,)

    numel = nbytes // 4

    def answer():
        """The child's next answer within TIMEOUT_S; a child that exited is
        told within a second."""
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                return q_out.get(timeout=1)
            except queue.Empty:
                if not proc.is_alive():
                    raise RuntimeError(f"the child exited with {proc.exitcode}") from None
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"no answer from the child in {TIMEOUT_S} s") from None

    try:
        for _ in range(WARMUP):
            t = torch.full((numel,), 7.0, device=dev)
            q_in.put(t)
            r = answer()
            got = t if mode == "ack" else r
            if mode == "ack" and r != numel:
                raise RuntimeError(f"ack {r!r}, expected {numel}")
            if not isinstance(got, torch.Tensor) or got.device != dev or not bool((got == 8).all()):
                raise RuntimeError(f"{mode}: the child's write did not arrive")
            del t, r, got
        q_in.put(REPORT)
        child_before = answer()
        before = collect_and_count()

        start = time.perf_counter()
        for _ in range(iters):
            t = torch.zeros(numel, device=dev)
            q_in.put(t)
            r = answer()
            del t, r  # as the C++ loop's scope ends
        elapsed = time.perf_counter() - start

        q_in.put(REPORT)
        child_after = answer()
        after = collect_and_count()
        q_in.put(None)
        proc.join(TIMEOUT_S)
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(TIMEOUT_S)
    if proc.exitcode != 0:
        raise RuntimeError(f"the child exited with {proc.exitcode}")
    counts = {
        "parent_d_fds": (after[0] - before[0], "fds"),
        "parent_d_maps": (after[1] - before[1], "maps"),
        "parent_d_shm": (after[2] - before[2], "files"),
        "parent_d_allocated": (after[3] - before[3], "bytes"),
        "child_d_fds": (child_after[0] - child_before[0], "fds"),
        "child_d_maps": (child_after[1] - child_before[1], "maps"),
        "child_d_allocated": (child_after[2] - child_before[2], "bytes"),
    }
    return iters / elapsed, counts


def skip_reason(device):
    if device == "cuda" and not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=MODES, help="one mode (default: both)")
    parser.add_argument("--bytes", type=int, help="one tensor size in bytes (default: 4 KiB, 1 MiB, 64 MiB)")
    parser.add_argument("--iters", type=int, help="timed round trips (default: the C++ benchmark's)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the same protocol over shared memory, figures named torch_cpu_queue_*")
    args = parser.parse_args()
    if args.iters is not None and args.iters <= 0:
        parser.error(f"--iters {args.iters}: expected a positive count")
    if args.bytes is not None and (args.bytes <= 0 or args.bytes % 4 != 0):
        parser.error(f"--bytes {args.bytes}: expected a positive multiple of 4 (float32 elements)")
    why = skip_reason(args.device)
    if why is not None:
        print(f"SKIP torch_cuda_queue.py: {why}", flush=True)
        return 0
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"# torch {torch.__version__}, {where}, spawn context", flush=True)
    modes = [args.mode] if args.mode else list(MODES)
    sizes = [args.bytes] if args.bytes is not None else list(SIZES)
    for mode in modes:
        for nbytes in sizes:
            iters = args.iters or ITERS.get(nbytes, 1000)
            rate, counts = bench(mode, nbytes, iters, args.device)
            name = f"torch_{args.device}_queue_{mode}_{size_name(nbytes)}"
            print(f"figure {name} {rate:.1f} round_trips/s", flush=True)
            for key, (value, unit) in counts.items():
                print(f"figure {name}_{key} {value} {unit}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
