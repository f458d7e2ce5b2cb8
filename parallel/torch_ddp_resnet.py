"""PyTorch's side of the ResNet rows of //parallel:ddp_benchmark.

torchvision's resnet18 with 10 classes on 3x32x32 images, SGD lr 0.01,
cross-entropy, one thread per process: DistributedDataParallel over gloo with
2 ranks of batch 8 each, and one process on the whole batch of 16. Each
measurement is the protocol of ddp_benchmark.cc: a fresh model, 30 steps, the
median of the last 25. Prints one line per measurement, in milliseconds.

  /usr/bin/python3 parallel/torch_ddp_resnet.py
"""
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torchvision

WORLD, GLOBAL_BATCH, CLASSES, SIZE, STEPS = 2, 16, 10, 32, 30


def model():
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=CLASSES)


def median_step_ms(net, batch):
    x = torch.randn(batch, 3, SIZE, SIZE)
    y = torch.randint(0, CLASSES, (batch,))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    times = []
    for _ in range(STEPS):
        start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[5:]) * 1e3


def worker(rank, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29534")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    ms = median_step_ms(torch.nn.parallel.DistributedDataParallel(model()), GLOBAL_BATCH // WORLD)
    if rank == 0:
        queue.put(ms)
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(f"resnet18_single_process_b{GLOBAL_BATCH} {median_step_ms(model(), GLOBAL_BATCH):.2f}ms")
    print(f"resnet18_single_process_b{GLOBAL_BATCH // WORLD} "
          f"{median_step_ms(model(), GLOBAL_BATCH // WORLD):.2f}ms")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    ms = queue.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    print(f"resnet18_ddp_gloo_{WORLD}rank_b{GLOBAL_BATCH // WORLD}each {ms:.2f}ms")
