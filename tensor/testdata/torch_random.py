"""PyTorch's side of tensor/torch_random_test.cc: what torch's CPU generator
draws for a list of cases, one per line, as "<case words>: <values>".

Floats are written with float.hex, so the comparison is exact.
"""
import torch

SEEDS = [0, 1, 42, 2**32 + 7, 67280421310721]


def gen(seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def main():
    for seed in SEEDS:
        for n in [0, 1, 2, 3, 10, 100, 1000, 12345]:
            values = torch.randperm(n, generator=gen(seed)).tolist()
            print(f"randperm {n} {seed}:", *values)
        for low, high, count in [(0, 37, 50), (-5, 5, 20), (0, 2**40, 20), (10, 11, 5),
                                 (-2**62, 2**62, 10)]:
            values = torch.randint(low, high, (count,), generator=gen(seed)).tolist()
            print(f"randint {low} {high} {count} {seed}:", *values)
        values = torch.rand(20, dtype=torch.float64, generator=gen(seed)).tolist()
        print(f"rand64 20 {seed}:", *[v.hex() for v in values])
        # uniform_ and normal_ of float32 and float64, sizes on both sides of
        # the 16-element fill; two calls on one generator (the cached normal).
        for dtype in ["float32", "float64"]:
            for n in [1, 3, 15, 16, 17, 40, 100]:
                g = gen(seed)
                t = torch.empty(n, dtype=getattr(torch, dtype)).uniform_(-0.3, 0.7, generator=g)
                print(f"uniform {dtype} {n} {seed}:", *[v.hex() for v in t.double().tolist()])
                g = gen(seed)
                first = torch.randn(n, dtype=getattr(torch, dtype), generator=g)
                second = torch.randn(3, dtype=getattr(torch, dtype), generator=g)
                values = torch.cat([first, second]).double().tolist()
                print(f"randn {dtype} {n} {seed}:", *[v.hex() for v in values])
        # What DataLoader draws its base seed with.
        value = torch.empty((), dtype=torch.int64).random_(generator=gen(seed)).item()
        print(f"random_int64 {seed}:", value)
    # Generator states (torch.get_rng_state()'s bytes, hex): right after
    # seeding, after some draws, and with a cached double normal; then what a
    # generator set to a state draws next.
    for seed, draws in [(5, 0), (5, 9), (123, 700), (7, -1)]:
        g = gen(seed)
        if draws > 0:
            torch.randint(0, 10, (draws,), generator=g)
        elif draws < 0:
            torch.randn(3, dtype=torch.float64, generator=g)
        print(f"state {seed} {draws}:", g.get_state().numpy().tobytes().hex())
        print(f"after_state {seed} {draws}:", *torch.randperm(20, generator=g).tolist())
    # The default generator after manual_seed.
    torch.manual_seed(7)
    print("default_randperm 20 7:", *torch.randperm(20).tolist())


if __name__ == "__main__":
    main()
