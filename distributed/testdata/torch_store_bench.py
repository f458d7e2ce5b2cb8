"""PyTorch 2.x's side of store_scale_benchmark.cc: the same table for
torch.distributed.TCPStore (libuv server in this process, or the server at
--port, e.g. Ember's).

  python torch_store_bench.py [--ops 20000] [--clients 256,1024,4096]
                              [--processes 1,8] [--port P] [--classic]
"""
import argparse
import multiprocessing
import resource
import statistics
import time
from datetime import timedelta

import torch.distributed as dist

TIMEOUT = timedelta(seconds=300)


def client(port):
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT,
                         wait_for_workers=False)


def median_us(ops, op):
    times = []
    for i in range(ops):
        start = time.perf_counter()
        op(i)
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def barrier_clients(port, clients, total, name):
    stores = []
    for _ in range(clients):
        store = client(port)
        if store.add(name + "/arrived", 1) == total:
            store.set(name + "/go", "1")
        stores.append(store)
    for store in stores:
        store.wait([name + "/go"])


def barrier_seconds(port, clients, processes, name):
    start = time.perf_counter()
    if processes == 1:
        barrier_clients(port, clients, clients, name)
    else:
        context = multiprocessing.get_context("fork")
        shares = [clients // processes + (1 if p < clients % processes else 0)
                  for p in range(processes)]
        children = [context.Process(target=barrier_clients, args=(port, share, clients, name))
                    for share in shares]
        for child in children:
            child.start()
        for child in children:
            child.join()
            if child.exitcode != 0:
                raise SystemExit(f"a barrier process failed ({child.exitcode})")
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", type=int, default=20000)
    parser.add_argument("--clients", default="256,1024,4096")
    parser.add_argument("--processes", default="1,8")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--classic", action="store_true", help="the non-libuv server")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = None
    port = args.port
    if port == 0:
        server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT,
                               wait_for_workers=False, use_libuv=not args.classic)
        port = server.port
    store = client(port)
    value = b"v" * 32
    store.set("bench/present", value)
    kind = ("classic" if args.classic else "libuv") if server else "another"
    print(f"torch.distributed.TCPStore {dist.__name__} (PyTorch's client, {kind} server), "
          f"{args.ops} ops each")
    print(f"  set   {median_us(args.ops, lambda i: store.set(f'bench/k{i % 64}', value)):8.1f} us")
    print(f"  get   {median_us(args.ops, lambda i: store.get('bench/present')):8.1f} us")
    print(f"  add   {median_us(args.ops, lambda i: store.add('bench/n', 1)):8.1f} us")
    round_ = 0
    for processes in [int(p) for p in args.processes.split(",")]:
        for clients in [int(n) for n in args.clients.split(",")]:
            seconds = barrier_seconds(port, clients, processes, f"barrier/{round_}")
            round_ += 1
            plural = "" if processes == 1 else "es"
            print(f"  barrier of {clients:5d} clients in {processes} process{plural}: "
                  f"{seconds:7.3f} s", flush=True)


if __name__ == "__main__":
    main()
