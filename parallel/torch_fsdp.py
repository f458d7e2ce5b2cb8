"""PyTorch's side of //parallel:fsdp_benchmark.

PyTorch 2.x's fully_shard (FSDP2, per-unit all_gather / reduce_scatter) and
DistributedDataParallel over gloo, 2 ranks of one thread each, on the models
of fsdp_benchmark.cc: the 4x512 ReLU MLP with a 10-way head (batch 32 per
rank; units: each Linear) and ResNet-18 with 10 classes on 3x32x32 images
(batch 8 per rank; units: each BasicBlock; written here in torchvision's
layout, as torchvision is not installed), SGD lr 0.01 momentum 0.9,
cross-entropy. Protocol of the Ember side: a fresh model per measurement,
every step timed (30 for the MLP, 15 for ResNet-18), the median of all but
the first 5. Each measurement runs in freshly spawned processes.

Memory per rank (rank 0): state_MiB, the bytes of the local parameters,
gradients and optimizer state after the last step (counted from the
tensors); rss_peak_MiB, the growth of the process's peak resident set from
before the model was built to the end (PyTorch keeps no statistics of its CPU
allocator, so this is the closest measure of the peak; it includes freed
memory that malloc kept).

The rows "mlp4" (fsdp_benchmark.cc's BM_MlpFsdp4Ranks): the MLP on 4 ranks,
fully_shard over all 4 and HSDP (fully_shard on a 2-D DeviceMesh of 2
replicas x 2 shards: torch's HYBRID_SHARD), same batch per rank.

  "$(tools/install_peers.sh --python)" parallel/torch_fsdp.py [mlp|resnet|mlp4]...  # the PyTorch 2.x peer
"""
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD, CLASSES = 2, 10


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return torch.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, inplanes = [], 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(nn.Sequential(BasicBlock(inplanes, planes, stride),
                                        BasicBlock(planes, planes, 1)))
            inplanes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def make(model):
    torch.manual_seed(0)
    if model == "mlp":
        layers = []
        for _ in range(4):
            layers += [nn.Linear(512, 512), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(512, CLASSES))
    return ResNet18(CLASSES)


def units(model, net):
    kind = nn.Linear if model == "mlp" else BasicBlock
    return [m for m in net.modules() if isinstance(m, kind)]


def inputs(model):
    if model == "mlp":
        return torch.randn(32, 512), torch.randint(0, CLASSES, (32,))
    return torch.randn(8, 3, 32, 32), torch.randint(0, CLASSES, (8,))


def local_bytes(tensors):
    total = 0
    for t in tensors:
        if t is None:
            continue
        if hasattr(t, "to_local"):
            t = t.to_local()
        total += t.numel() * t.element_size()
    return total


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker(rank, model, kind, port, queue, world):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(100 + rank)
    x, y = inputs(model)
    rss_before = rss_mib()
    net = make(model)
    if kind == "ddp":
        net = nn.parallel.DistributedDataParallel(net)
    else:
        from torch.distributed.fsdp import fully_shard
        mesh = None
        if kind == "fully_shard_hybrid":
            from torch.distributed.device_mesh import init_device_mesh
            mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("replicate", "shard"))
        for unit in units(model, net):
            fully_shard(unit, mesh=mesh)
        fully_shard(net, mesh=mesh)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    steps = 30 if model == "mlp" else 15
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    params = list(net.parameters())
    state = local_bytes(params) + local_bytes(p.grad for p in params)
    for s in opt.state.values():
        state += local_bytes(v for v in s.values() if torch.is_tensor(v))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - rss_before
    if rank == 0:
        queue.put((statistics.median(times[5:]) * 1e3, state / 2**20, peak))
    dist.destroy_process_group()


def measure(model, kind, port, world=WORLD):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, model, kind, port, queue, world))
             for r in range(world)]
    for p in procs:
        p.start()
    result = queue.get(timeout=900)
    for p in procs:
        p.join(timeout=60)
    return result


if __name__ == "__main__":
    models = sys.argv[1:] or ["mlp", "resnet"]
    print(f"torch {torch.__version__}, gloo, {WORLD} ranks, 1 thread each")
    port = 29600 + os.getpid() % 1000
    for model in models:
        if model == "mlp4":
            for kind in ("fully_shard", "fully_shard_hybrid"):
                port += 1
                ms, state, peak = measure("mlp", kind, port, world=4)
                print(f"mlp 4 ranks {kind}: median_ms={ms:.2f} state_MiB={state:.2f} "
                      f"rss_peak_MiB={peak:.1f}", flush=True)
            continue
        for kind in ("ddp", "fully_shard", "ddp"):
            port += 1
            ms, state, peak = measure(model, kind, port)
            print(f"{model} {kind}: median_ms={ms:.2f} state_MiB={state:.2f} "
                  f"rss_peak_MiB={peak:.1f}", flush=True)
