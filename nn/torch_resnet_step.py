"""PyTorch's side of BM_ResNetStep in nn/conv_benchmark.cc.

torchvision's resnet18 with 10 classes on 3x32x32 images, SGD lr 0.01,
cross-entropy: one process at batch 16 and 64 on 1 and 2 threads. Each
measurement follows conv_benchmark.cc's protocol: a fresh model, 30 steps, the
median of the last 25. Prints one line per measurement, in milliseconds, and
whether PyTorch was built with oneDNN (MKL-DNN) and uses it.

  /usr/bin/python3 nn/torch_resnet_step.py [ROUNDS]
"""
import statistics
import sys
import time

import torch
import torchvision

CLASSES, SIZE, STEPS = 10, 32, 30


def median_step_ms(batch):
    torch.manual_seed(0)
    net = torchvision.models.resnet18(num_classes=CLASSES)
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


if __name__ == "__main__":
    print(f"torch {torch.__version__} mkldnn available={torch.backends.mkldnn.is_available()} "
          f"enabled={torch.backends.mkldnn.enabled}")
    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 1):
        for batch in (16, 64):
            for threads in (1, 2):
                torch.set_num_threads(threads)
                print(f"resnet18_step_b{batch}_t{threads} {median_step_ms(batch):.2f}ms", flush=True)
