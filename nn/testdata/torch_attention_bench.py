"""PyTorch's side of nn/attention_benchmark.cc.

    torch_attention_bench.py [--iterations N]

torch.nn.functional.scaled_dot_product_attention forward + backward on the
CPU at B=4, H=8, L=S=512, E=64, float32, causal and not, at 1 and 2 threads:
one step is the forward and torch.autograd.grad of (out * g) for q, k, v, as
the Ember benchmark's; prints the median step in ms per configuration.
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=5)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    shape = (4, 8, 512, 64)
    q, k, v = (torch.randn(shape, generator=gen).requires_grad_() for _ in range(3))
    g = torch.randn(shape, generator=gen)
    for causal in (False, True):
        for threads in (1, 2):
            torch.set_num_threads(threads)

            def step():
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                return torch.autograd.grad(out, (q, k, v), g)

            step()  # warm-up
            ms = []
            for _ in range(args.iterations):
                start = time.perf_counter()
                step()
                ms.append((time.perf_counter() - start) * 1e3)
            print(f"torch_sdpa/causal={int(causal)}/threads={threads} "
                  f"median_ms={statistics.median(ms):.2f}")


if __name__ == "__main__":
    main()
