"""PyTorch's side of pool_benchmark: the same work through
torch.multiprocessing's Pool (fork context) and Lock.

Each bench_* function prints nothing and returns a rate; pool_benchmark calls
them through `python3 -c` when EMBER_TORCH_PEER points at this file, e.g.

  /usr/bin/python3 -c "import torch_mp_pool as p; print(p.bench_map_ints(20000, 2))"
"""
import time

import torch
import torch.multiprocessing as mp


def square(x):
    return x * x


def tensor_sum(t):
    return float(t.sum())


def _pool(processes):
    pool = mp.get_context("fork").Pool(processes)
    pool.map(square, range(processes * 4))  # every worker started and warm
    return pool


def _rate(fn, items, repeats):
    """Items per second over `repeats` rounds of fn (as the C++ side counts)."""
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return items * repeats / (time.perf_counter() - start)


def bench_map_ints(n, processes, repeats=3):
    """Items per second of pool.map(square, range(n)), default chunksize."""
    with _pool(processes) as pool:
        return _rate(lambda: pool.map(square, range(n)), n, repeats)


def bench_map_tensors(n, numel, processes, repeats=3):
    """Items per second of pool.map(tensor_sum, tensors): n fresh float32
    tensors of numel elements each round (each moves to shared memory when
    sent, as in Ember)."""
    with _pool(processes) as pool:
        def run():
            tensors = [torch.ones(numel) for _ in range(n)]
            pool.map(tensor_sum, tensors)
        return _rate(run, n, repeats)


def bench_apply(n, processes, repeats=3):
    """Round trips per second of pool.apply(square, (i,)), one at a time."""
    with _pool(processes) as pool:
        def run():
            for i in range(n):
                pool.apply(square, (i,))
        return _rate(run, n, repeats)


def bench_lock(n, repeats=3):
    """Uncontended acquire+release pairs per second of mp.Lock."""
    lock = mp.get_context("fork").Lock()

    def run():
        for _ in range(n):
            lock.acquire()
            lock.release()
    return _rate(run, n, repeats)
