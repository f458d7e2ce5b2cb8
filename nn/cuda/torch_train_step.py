"""PyTorch's side of nn/cuda/train_step_benchmark.cc, on the same GPU.

Measures PyTorch 2.x eager with the benchmark's protocol (warm-up steps, then
the median of synchronised steps): ResNet-18 (batch 64, 3x224x224, fp32,
SGD lr 0.01, cross-entropy), the 4x512 MLP of nn/benchmark_mlp.h (batch 64,
fp32, its host time too), the 4x4096 MLP (batch 4096, bf16), the host time
of a one-element add enqueued with out= (cuda/kernels_benchmark.cc's
BM_SmallAddHostOverhead) and scaled_dot_product_attention's forward and
backward (B=4, H=16, L=S=2048, E=64, bf16, causal and not). Prints one line per figure, in the benchmark's
`ember-figure` form with a `torch-figure` prefix.

With --ember-log FILE (the GPU bundle's log, holding the output of
train_step_benchmark and kernels_benchmark), it then prints Ember's figure
beside PyTorch's, their ratio and the issue's target for each.

  python3 torch_train_step.py [--ember-log FILE]
"""
import argparse
import re
import statistics
import sys
import time

try:
    import torch
except ImportError:
    print("torch_train_step.py: python3 has no torch", file=sys.stderr)
    sys.exit(3)

WARMUP = 5


def resnet18(num_classes):
    """torchvision's resnet18, or the same network written out when
    torchvision is not installed."""
    try:
        import torchvision

        return torchvision.models.resnet18(num_classes=num_classes)
    except ImportError:
        pass
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, inp, planes, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(inp, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = None
            if stride != 1 or inp != planes:
                self.downsample = nn.Sequential(
                    nn.Conv2d(inp, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

        def forward(self, x):
            out = torch.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            shortcut = x if self.downsample is None else self.downsample(x)
            return torch.relu(out + shortcut)

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
              nn.MaxPool2d(3, 2, 1)]
    inp = 64
    for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(inp, planes, stride), Block(planes, planes, 1)]
        inp = planes
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


def mlp(width, hidden, classes):
    layers = []
    for _ in range(hidden):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, classes))
    return torch.nn.Sequential(*layers)


def median_step(net, x, y, steps, warmup=WARMUP, float_loss=False):
    """Median ms of a synchronised step, and median host ms to enqueue it."""
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    total, host = [], []
    for i in range(warmup + steps):
        start = time.perf_counter()
        opt.zero_grad()
        logits = net(x)
        if float_loss:
            logits = logits.float()
        torch.nn.functional.cross_entropy(logits, y).backward()
        opt.step()
        enqueued = time.perf_counter()
        torch.cuda.synchronize()
        if i >= warmup:
            total.append((time.perf_counter() - start) * 1e3)
            host.append((enqueued - start) * 1e3)
    return statistics.median(total), statistics.median(host)


def timed(fn, steps):
    """Median ms of fn() followed by a device synchronisation."""
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def small_add_host_us(calls=20000):
    a = torch.ones(1, device="cuda")
    out = torch.empty(1, device="cuda")
    for _ in range(1000):
        torch.add(a, a, out=out)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        torch.add(a, a, out=out)
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def layer_host_us(layer, calls=2000):
    """Median host microseconds per call of one of ResNet-18's layer1 layers
    on a batch of 2 (train_step_benchmark's BM_LayerHost), synchronising,
    untimed, every 64 calls."""
    dev = torch.device("cuda:0")
    torch.manual_seed(0)
    x = torch.randn(2, 64, 56, 56, device=dev)
    w = torch.randn(64, 64, 3, 3, device=dev) * 0.05
    mean, var = torch.zeros(64, device=dev), torch.ones(64, device=dev)
    gamma, beta = torch.ones(64, device=dev), torch.zeros(64, device=dev)
    leaf, wleaf = x.detach().requires_grad_(), w.detach().requires_grad_()
    F = torch.nn.functional

    def call():
        if layer == "conv2d":
            return F.conv2d(x, w, None, 1, 1)
        if layer == "conv2d_fwd_bwd":
            y = F.conv2d(leaf, wleaf, None, 1, 1)
            y.sum().backward()
            return y
        if layer == "batch_norm":
            return F.batch_norm(x, mean, var, gamma, beta, True)
        return torch.relu(x)

    for _ in range(20):
        call()
    torch.cuda.synchronize()
    us = []
    for i in range(calls):
        start = time.perf_counter()
        call()
        us.append((time.perf_counter() - start) * 1e6)
        if (i + 1) % 64 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(us)


LAYERS = ("conv2d", "conv2d_fwd_bwd", "batch_norm", "relu")


def measure():
    """Every figure; one that fails (say, out of memory) is reported and left
    out, and the others are still measured."""
    dev = torch.device("cuda:0")
    figures = {}

    def resnet():
        torch.manual_seed(0)
        net = resnet18(1000).to(dev).train()
        x = torch.randn(64, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (64,), device=dev)
        (figures["resnet18_step_b64_fp32_ms"],
         figures["resnet18_step_b64_fp32_host_ms"]) = median_step(net, x, y, 25)

    def mlp512():
        torch.manual_seed(0)
        net = mlp(512, 4, 10).to(dev)
        x = torch.randn(64, 512, device=dev)
        y = torch.randint(0, 10, (64,), device=dev)
        ms, host = median_step(net, x, y, 300, warmup=20)
        figures["mlp512_step_b64_fp32_us"] = ms * 1e3
        figures["mlp512_step_b64_fp32_host_us"] = host * 1e3

    def mlp4096():
        torch.manual_seed(0)
        net = mlp(4096, 4, 10).to(dev, torch.bfloat16)
        x = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
        y = torch.randint(0, 10, (4096,), device=dev)
        figures["mlp4096_step_b4096_bf16_ms"] = median_step(net, x, y, 20, float_loss=True)[0]

    def resnet_variants():
        for mixed in (False, True):
            torch.manual_seed(0)
            net = resnet18(1000).to(dev).train()
            opt = torch.optim.SGD(net.parameters(), lr=0.01)
            x = torch.randn(64, 3, 224, 224, device=dev)
            y = torch.randint(0, 1000, (64,), device=dev)

            def step():
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mixed):
                    loss = torch.nn.functional.cross_entropy(net(x), y)
                loss.backward()
                opt.step()

            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUP):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            name = "resnet18_step_b64_" + ("autocast_bf16" if mixed else "fp32")
            if mixed:
                figures[name + "_ms"] = timed(step, 25)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            figures[name + "_graphed_ms"] = timed(graph.replay, 25)

    def mlp4096_autocast():
        torch.manual_seed(0)
        net = mlp(4096, 4, 10).to(dev)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        x = torch.randn(4096, 4096, device=dev)
        y = torch.randint(0, 10, (4096,), device=dev)

        def step():
            opt.zero_grad()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            opt.step()

        for _ in range(WARMUP):
            step()
        figures["mlp4096_step_b4096_autocast_bf16_ms"] = timed(step, 20)

    def allocator():
        pairs = 10000
        keep = torch.cuda.caching_allocator_alloc(1 << 20)
        samples = []
        for _ in range(20):
            start = time.perf_counter()
            for _ in range(pairs):
                torch.cuda.caching_allocator_delete(torch.cuda.caching_allocator_alloc(1 << 20))
            samples.append((time.perf_counter() - start) * 1e9 / pairs)
        torch.cuda.caching_allocator_delete(keep)
        figures["cached_alloc_free_1mib_ns"] = statistics.median(samples)

    def small_add():
        figures["small_add_host_us"] = small_add_host_us()

    def sdpa():
        F = torch.nn.functional
        for causal in (False, True):
            torch.manual_seed(2)
            q, k, v = (torch.randn(4, 16, 2048, 64, device=dev, dtype=torch.bfloat16)
                       .requires_grad_() for _ in range(3))
            g = torch.randn(4, 16, 2048, 64, device=dev, dtype=torch.bfloat16)

            def step():
                q.grad = k.grad = v.grad = None
                F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(g)

            for _ in range(WARMUP):
                step()
            torch.cuda.synchronize()
            name = "sdpa_fwd_bwd_b4h16l2048e64_bf16" + ("_causal" if causal else "")
            figures[name + "_ms"] = timed(step, 20)

    def layers():
        for layer in LAYERS:
            figures[f"layer_host_{layer}_us"] = layer_host_us(layer)

    failed = 0
    for case in (resnet, mlp512, mlp4096, small_add, layers, resnet_variants, mlp4096_autocast,
                 allocator, sdpa):
        try:
            case()
        except Exception as e:  # noqa: BLE001 (report and go on)
            failed += 1
            print(f"torch_train_step.py: {case.__name__} failed: {e!r}", file=sys.stderr)
        torch.cuda.empty_cache()
    return figures, failed


UNITS = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def ember_figures(path):
    figures = {}
    with open(path, errors="replace") as f:
        for line in f:
            m = re.match(r"ember-figure (\S+) ([0-9.eE+-]+)\s*$", line)
            if m:
                figures[m.group(1)] = float(m.group(2))
            m = re.match(r"BM_SmallAddHostOverhead\s+([0-9.]+) (ns|us|ms|s)\b", line)
            if m:
                figures["small_add_host_us"] = float(m.group(1)) * UNITS[m.group(2)]
    return figures


def report(ember, torch_figures):
    rows = [
        ("ResNet-18 step, batch 64 fp32 (ms) vs PyTorch", "resnet18_step_b64_fp32_ms",
         "resnet18_step_b64_fp32_ms", False, "<= 1.10"),
        ("  its host time to enqueue a step (ms) vs PyTorch", "resnet18_step_b64_fp32_host_ms",
         "resnet18_step_b64_fp32_host_ms", False, ""),
        ("  the same step, convolutions by cuDNN's graph API", "resnet18_step_b64_fp32_ms_graph",
         "resnet18_step_b64_fp32_ms", False, "<= 1.10"),
        ("    its host time", "resnet18_step_b64_fp32_host_ms_graph",
         "resnet18_step_b64_fp32_host_ms", False, ""),
        ("4x512 MLP step, batch 64 fp32 (us) vs PyTorch", "mlp512_step_b64_fp32_us",
         "mlp512_step_b64_fp32_us", False, "<= 1.50"),
        ("  its host time to enqueue a step (us) vs PyTorch", "mlp512_step_b64_fp32_host_us",
         "mlp512_step_b64_fp32_host_us", False, ""),
        ("host time per small op enqueued (us) vs PyTorch", "small_add_host_us",
         "small_add_host_us", False, "Ember <= 5 us"),
    ] + [
        (f"host time per {layer} call, batch 2 (us) vs PyTorch", f"layer_host_{layer}_us",
         f"layer_host_{layer}_us", False, "") for layer in LAYERS
    ] + [
        (f"host time per {layer} call, cuDNN's graph API, vs PyTorch",
         f"layer_host_{layer}_graph_us", f"layer_host_{layer}_us", False, "")
        for layer in ("conv2d", "conv2d_fwd_bwd")
    ] + [
        ("4x4096 MLP step, batch 4096 bf16 (ms) vs its GEMMs in cuBLAS",
         "mlp4096_step_b4096_bf16_ms", "mlp4096_gemms_b4096_bf16_ms", True, "<= 1.15"),
        ("4x4096 MLP step, batch 4096 bf16 (ms) vs PyTorch", "mlp4096_step_b4096_bf16_ms",
         "mlp4096_step_b4096_bf16_ms", False, ""),
        ("ResNet-18 step b64 fp32, graphed (ms) vs PyTorch eager", "resnet18_step_b64_fp32_graphed_ms",
         "resnet18_step_b64_fp32_ms", False, "<= 0.85"),
        ("  vs PyTorch's torch.cuda.graphs step", "resnet18_step_b64_fp32_graphed_ms",
         "resnet18_step_b64_fp32_graphed_ms", False, "<= 1.00"),
        ("ResNet-18 step b64 autocast bf16 (ms) vs PyTorch's", "resnet18_step_b64_autocast_bf16_ms",
         "resnet18_step_b64_autocast_bf16_ms", False, "<= 1.00"),
        ("  graphed, vs PyTorch's graphed", "resnet18_step_b64_autocast_bf16_graphed_ms",
         "resnet18_step_b64_autocast_bf16_graphed_ms", False, "<= 1.00"),
        ("4x4096 MLP step b4096 autocast bf16 (ms) vs PyTorch's", "mlp4096_step_b4096_autocast_bf16_ms",
         "mlp4096_step_b4096_autocast_bf16_ms", False, "<= 1.00"),
        ("cached 1 MiB allocation + free (ns) vs PyTorch's", "cached_alloc_free_1mib_ns",
         "cached_alloc_free_1mib_ns", False, "<= 1.00"),
        ("SDPA fwd+bwd B4 H16 L2048 E64 bf16 (ms) vs PyTorch's", "sdpa_fwd_bwd_b4h16l2048e64_bf16_ms",
         "sdpa_fwd_bwd_b4h16l2048e64_bf16_ms", False, "<= 1.00"),
        ("  causal", "sdpa_fwd_bwd_b4h16l2048e64_bf16_causal_ms",
         "sdpa_fwd_bwd_b4h16l2048e64_bf16_causal_ms", False, "<= 1.00"),
    ]
    print(f"{'figure':<64} {'Ember':>10} {'baseline':>10} {'ratio':>7}  target")
    for title, mine, base, base_is_ember, target in rows:
        a = ember.get(mine)
        b = (ember if base_is_ember else torch_figures).get(base)
        ratio = f"{a / b:7.3f}" if a is not None and b else "      -"
        fa = f"{a:10.3f}" if a is not None else "         -"
        fb = f"{b:10.3f}" if b is not None else "         -"
        print(f"{title:<64} {fa} {fb} {ratio}  {target}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ember-log", help="a log holding the Ember benchmarks' output")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"torch_train_step.py: torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        sys.exit(3)
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
          f"{torch.backends.cudnn.version()}, {torch.cuda.get_device_name(0)}; "
          f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32} "
          f"matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32}")
    figures, failed = measure()
    for name, value in figures.items():
        print(f"torch-figure {name} {value:.4f}")
    if args.ember_log:
        print()
        report(ember_figures(args.ember_log), figures)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
