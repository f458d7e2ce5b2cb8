"""PyTorch 2.x's side of nn/autocast_benchmark.cc: the same training steps in
float32 and under torch.autocast("cpu") (bfloat16), one thread, the median
of 30 steps after 5 warm-up steps of a fresh model. Prints one line per
measurement, in milliseconds.

  OPENBLAS_NUM_THREADS=1 python3 nn/torch_autocast_step.py
"""
import contextlib
import statistics
import time

import torch
import torchvision

WARMUP, STEPS = 5, 30


def build(model):
    torch.manual_seed(0)
    if model == "resnet18":
        net = torchvision.models.resnet18(num_classes=10)
        return net, torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers, torch.nn.Linear(1024, 10))
    return net, torch.randn(256, 1024), torch.randint(0, 10, (256,))


def median_step_ms(model, mixed):
    net, x, y = build(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    times = []
    for _ in range(WARMUP + STEPS):
        start = time.perf_counter()
        opt.zero_grad()
        region = (torch.autocast("cpu", dtype=torch.bfloat16) if mixed
                  else contextlib.nullcontext())
        with region:
            loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[WARMUP:]) * 1e3


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}")
    for model in ("mlp", "resnet18"):
        for mixed in (False, True):
            print(f"{model} {'autocast_bf16' if mixed else 'float32'}: "
                  f"{median_step_ms(model, mixed):.2f} ms")
