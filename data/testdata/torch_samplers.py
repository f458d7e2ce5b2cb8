"""PyTorch's side of data/sampler_torch_test.cc: the indices torch's
samplers, random_split and DataLoader give for a list of cases, one per
line, as "<case words>: <indices>" (a DataLoader's batches separated by
"|").
"""
import itertools

import torch
from torch.utils.data import (DataLoader, DistributedSampler, RandomSampler,
                              SubsetRandomSampler, WeightedRandomSampler,
                              random_split)


def gen(seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def main():
    for n, replicas, seed, epoch, drop_last, shuffle in itertools.product(
            [0, 1, 7, 10, 33, 100], [1, 2, 3, 4, 8], [0, 42], [0, 1, 5],
            [False, True], [True, False]):
        for rank in range(replicas):
            s = DistributedSampler(range(n), num_replicas=replicas, rank=rank,
                                   shuffle=shuffle, seed=seed, drop_last=drop_last)
            s.set_epoch(epoch)
            print(f"distributed {n} {replicas} {rank} {seed} {epoch} {int(drop_last)} "
                  f"{int(shuffle)}:", *list(s))
    for n, replacement, num_samples, seed in [(10, False, None, 0), (10, False, 25, 1),
                                              (10, False, 20, 2), (50, True, None, 3),
                                              (50, True, 70, 4), (1000, False, None, 5),
                                              (5, True, 3, 6)]:
        g = gen(seed)
        s = RandomSampler(range(n), replacement=replacement, num_samples=num_samples,
                          generator=g)
        # Two epochs on one generator: the second continues its sequence.
        for e in range(2):
            print(f"random {n} {int(replacement)} {num_samples or 0} {seed} {e}:", *list(s))
    for seed in [0, 9]:
        s = SubsetRandomSampler([3, 1, 4, 1, 5, 9, 2, 6], generator=gen(seed))
        print(f"subset {seed}:", *list(s))
    for seed, weights, k in [(0, [0.1, 0.9, 0.4, 0.7, 3.0, 0.6], 20), (8, [1, 0, 2], 30)]:
        s = WeightedRandomSampler(weights, k, replacement=True, generator=gen(seed))
        print(f"weighted {seed} {k} {' '.join(map(str, weights))}:", *list(s))
    for seed, lengths in [(0, [3, 7]), (4, [0.5, 0.3, 0.2]), (11, [0.34, 0.33, 0.33])]:
        parts = random_split(range(10), lengths, generator=gen(seed))
        print(f"split {seed} {' '.join(map(str, lengths))}:",
              " | ".join(" ".join(map(str, p.indices)) for p in parts))
    for n, batch, drop_last, seed in [(10, 4, False, 0), (10, 4, True, 1), (37, 8, False, 2)]:
        loader = DataLoader(list(range(n)), batch_size=batch, shuffle=True,
                            drop_last=drop_last, generator=gen(seed))
        for e in range(2):
            print(f"loader {n} {batch} {int(drop_last)} {seed} {e}:",
                  " | ".join(" ".join(map(str, b.tolist())) for b in loader))
    # No generator: the base seed and the sampler's seed both come from the
    # default generator.
    torch.manual_seed(123)
    loader = DataLoader(list(range(12)), batch_size=5, shuffle=True)
    for e in range(2):
        print(f"default_loader 12 5 123 {e}:",
              " | ".join(" ".join(map(str, b.tolist())) for b in loader))


if __name__ == "__main__":
    main()
