"""PyTorch's side of //parallel:sync_batch_norm_benchmark.

torchvision's resnet18 with 10 classes on 3x64x64 images, batch 8 per rank,
cross-entropy, one thread per process, DistributedDataParallel over gloo on
2 ranks: the forward+backward step with its BatchNorm2d layers, and with them
synchronised over the group; then both again without DDP (each rank keeping
its own gradients). torch.nn.SyncBatchNorm refuses CPU tensors (its
statistics kernels are CUDA-only), so the synchronised step uses
CpuSyncBatchNorm below: the same algorithm as torch's CUDA SyncBatchNorm
(per-rank mean and variance, one all_gather of mean, squared deviations and
count in forward, one all_reduce of the two per-channel gradient sums in
backward) in torch's CPU ops. Each measurement is the protocol of
sync_batch_norm_benchmark.cc: a fresh model, 30 steps, the median of the last
25. Prints one line per measurement: rank 0's median wall time per step and
its median process CPU time (every thread), in milliseconds.

  OPENBLAS_NUM_THREADS=1 /root/.cache/ember/peers/torch-2.15.0/bin/python3 \\
      parallel/torch_sync_batch_norm_bench.py
"""
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
import torchvision

WORLD, BATCH, CLASSES, SIZE, STEPS = 2, 8, 10, 64, 30
# (DDP, synchronised batch norm), in the order of the Ember benchmark's rows.
CONFIGS = ((True, False), (True, True), (False, False), (False, True))


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum):
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        count = x.numel() // c
        var, mean = torch.var_mean(x, dim=dims, correction=0)
        local = torch.cat([mean, var * count, torch.tensor([float(count)], dtype=x.dtype)])
        gathered = torch.empty(WORLD * local.numel(), dtype=x.dtype)
        dist.all_gather_into_tensor(gathered, local)
        stats = gathered.view(WORLD, -1)
        counts = stats[:, -1:]
        total = counts.sum()
        means = stats[:, :c]
        global_mean = (means * counts).sum(0) / total
        squares = (stats[:, c:2 * c] + counts * (means - global_mean) ** 2).sum(0)
        global_var = squares / total
        running_mean.mul_(1 - momentum).add_(global_mean * momentum)
        running_var.mul_(1 - momentum).add_(squares / (total - 1) * momentum)
        invstd = torch.rsqrt(global_var + eps)
        ctx.save_for_backward(x, weight, global_mean, invstd)
        ctx.total = total
        return F.batch_norm(x, global_mean, global_var, weight, bias, False, 0.0, eps)

    @staticmethod
    def backward(ctx, grad):
        x, weight, mean, invstd = ctx.saved_tensors
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        shape = [1, c] + [1] * (x.dim() - 2)
        centred = x - mean.view(shape)
        sum_g = grad.sum(dims)
        sum_gx = (grad * centred).sum(dims)
        sums = torch.cat([sum_g, sum_gx])
        dist.all_reduce(sums)
        scale = (weight * invstd).view(shape)
        grad_x = scale * (grad - (sums[:c] / ctx.total).view(shape)
                          - centred * (invstd * invstd * sums[c:] / ctx.total).view(shape))
        return grad_x, sum_gx * invstd, sum_g, None, None, None, None


class CpuSyncBatchNorm(torch.nn.BatchNorm2d):
    def forward(self, x):
        if not self.training:
            return super().forward(x)
        self.num_batches_tracked.add_(1)
        return _SyncBatchNormFunction.apply(x, self.weight, self.bias, self.running_mean,
                                            self.running_var, self.eps, self.momentum)


def synchronised(module):
    """`module` with every BatchNorm2d replaced by a CpuSyncBatchNorm holding its tensors."""
    for name, child in module.named_children():
        if isinstance(child, torch.nn.BatchNorm2d):
            sync = CpuSyncBatchNorm(child.num_features, child.eps, child.momentum)
            sync.load_state_dict(child.state_dict())
            setattr(module, name, sync)
        else:
            synchronised(child)
    return module


def median_step_ms(sync, ddp):
    """The median wall and process CPU time (every thread) of the last 25 steps, in ms."""
    torch.manual_seed(0)
    net = torchvision.models.resnet18(num_classes=CLASSES)
    if sync:
        net = synchronised(net)
    if ddp:
        net = torch.nn.parallel.DistributedDataParallel(net)
    torch.manual_seed(100 + dist.get_rank())
    x = torch.randn(BATCH, 3, SIZE, SIZE)
    y = torch.randint(0, CLASSES, (BATCH,))
    wall, cpu = [], []
    for _ in range(STEPS):
        start, start_cpu = time.perf_counter(), time.process_time()
        net.zero_grad()
        F.cross_entropy(net(x), y).backward()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall[5:]) * 1e3, statistics.median(cpu[5:]) * 1e3


def worker(rank, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29541")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    for ddp, sync in CONFIGS:
        ms, cpu_ms = median_step_ms(sync, ddp)
        if rank == 0:
            queue.put((sync, ddp, ms, cpu_ms))
    dist.destroy_process_group()


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for _ in CONFIGS:
        sync, ddp, ms, cpu_ms = queue.get(timeout=900)
        layer = "sync_batch_norm" if sync else "batch_norm"
        wrapper = "ddp" if ddp else "no_ddp"
        print(f"resnet18_{wrapper}_gloo_{WORLD}rank_b{BATCH}each_{SIZE}px_{layer} {ms:.2f}ms cpu {cpu_ms:.2f}ms")
    for p in procs:
        p.join(timeout=60)
