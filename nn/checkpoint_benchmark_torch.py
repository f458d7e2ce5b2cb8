"""PyTorch's side of nn/checkpoint_benchmark.cc: the same two models and
steps, with and without torch.utils.checkpoint.checkpoint(use_reentrant=False),
measured the same way.

  /root/.cache/ember/peers/torch-2.15.0/bin/python3 nn/checkpoint_benchmark_torch.py

mlp_stack: 8 pre-norm residual MLP blocks (x + fc2(gelu(fc1(layer_norm(x))))),
width 256, hidden 1024, 512 rows, loss mean(out^2); checkpointed: each block.
resnet18: torchvision's resnet18 (10 classes) on 16 images of 3x128x128,
cross-entropy; checkpointed: each of layer1..layer4. A step is zero_grad (to
none), forward, loss, backward. Rows <model>/<checkpointed>/<threads>
(torch.set_num_threads 1 and 2): median_ms, the median of the steps after
the first 3 (20 steps for mlp_stack, 13 for resnet18, the Ember binary's
iteration counts); cpu_ms, the median step's process CPU time; saved_MiB,
the distinct storages saved for backward outside checkpointed regions when
the forward ends, parameters' storages left out (a saved_tensors_hooks scope
around one more forward).
"""
import statistics
import time

import torch
import torchvision
from torch.utils.checkpoint import checkpoint

WARMUP = 3


class MlpBlock(torch.nn.Module):
    def __init__(self, width, hidden):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.fc1 = torch.nn.Linear(width, hidden)
        self.act = torch.nn.GELU()
        self.fc2 = torch.nn.Linear(hidden, width)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class Checkpointed(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return checkpoint(self.module, x, use_reentrant=False)


def mlp_stack(checkpointed):
    blocks = [MlpBlock(256, 1024) for _ in range(8)]
    if checkpointed:
        blocks = [Checkpointed(b) for b in blocks]
    model = torch.nn.Sequential(*blocks)
    x = torch.randn(8 * 64, 256)

    def loss():
        out = model(x)
        return (out * out).mean()
    return model, loss


def resnet18(checkpointed):
    model = torchvision.models.resnet18(num_classes=10)
    if checkpointed:
        for name in ["layer1", "layer2", "layer3", "layer4"]:
            setattr(model, name, Checkpointed(getattr(model, name)))
    x = torch.randn(16, 3, 128, 128)
    y = torch.randint(0, 10, (16,))
    return model, lambda: torch.nn.functional.cross_entropy(model(x), y)


def saved_mib(model, loss_fn):
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen, total = set(), 0

    def pack(t):
        nonlocal total
        s = t.untyped_storage()
        if s.data_ptr() not in params and s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            total += s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn()
    loss.backward()
    return total / 2**20


def measure(name, build, steps):
    for checkpointed in (0, 1):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            torch.manual_seed(0)
            model, loss_fn = build(bool(checkpointed))
            times, cpu = [], []
            for _ in range(steps):
                start, cpu_start = time.perf_counter(), time.process_time()
                model.zero_grad(set_to_none=True)
                loss_fn().backward()
                cpu.append((time.process_time() - cpu_start) * 1e3)
                times.append((time.perf_counter() - start) * 1e3)
            model.zero_grad(set_to_none=True)
            saved = saved_mib(model, loss_fn)
            print(f"{name}/{checkpointed}/{threads} "
                  f"median_ms={statistics.median(times[WARMUP:]):.2f} "
                  f"cpu_ms={statistics.median(cpu[WARMUP:]):.2f} saved_MiB={saved:.2f}",
                  flush=True)


if __name__ == "__main__":
    print(f"torch {torch.__version__}")
    measure("mlp_stack", mlp_stack, 20)
    measure("resnet18", resnet18, 13)
