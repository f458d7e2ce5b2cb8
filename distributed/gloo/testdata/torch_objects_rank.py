"""One PyTorch rank of distributed/gloo/torch_objects_test: every object
collective, in a gloo group shared with Ember ranks.

usage: torch_objects_rank.py STORE_PATH RANK WORLD_SIZE

Joins through the Ember FileStore at STORE_PATH (torch_rank.py's
EmberFileStore), runs the sequence torch_objects_test.cc runs on its Ember
ranks, and checks every object it receives against the literal values both
sides build. Exit status: 0 when all matched, 1 with a message otherwise, 77
when torch is missing.
"""
import os
import sys
from datetime import timedelta

try:
    import torch
    import torch.distributed as dist
except ImportError:
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_rank import EmberFileStore  # noqa: E402


def send_object_list(objects, dst):
    """torch.distributed.send_object_list (PyTorch 2.x); PyTorch 1.13 has
    none, so there it issues what 2.x's does: the int64 sizes, then the
    concatenated pickles, with 1.13's own _object_to_tensor."""
    if hasattr(dist, "send_object_list"):
        return dist.send_object_list(objects, dst=dst)
    from torch.distributed import distributed_c10d as c10d
    tensors, sizes = zip(*[c10d._object_to_tensor(o, torch.device("cpu")) for o in objects])
    dist.send(torch.cat(sizes), dst)
    dist.send(torch.cat(tensors), dst)


def recv_object_list(objects, src):
    """torch.distributed.recv_object_list, or 2.x's sequence on 1.13."""
    if hasattr(dist, "recv_object_list"):
        return dist.recv_object_list(objects, src=src)
    from torch.distributed import distributed_c10d as c10d
    sizes = torch.empty(len(objects), dtype=torch.long)
    dist.recv(sizes, src)
    payload = torch.empty(int(sizes.sum().item()), dtype=torch.uint8)
    dist.recv(payload, src)
    offset = 0
    for i, size in enumerate(sizes.tolist()):
        objects[i] = c10d._tensor_to_object(payload[offset:offset + size], size)
        offset += size


def obj(r):
    return {"rank": r, "name": f"rank-{r}", 7: [r * 1.5, None, r % 2 == 0, b"\x01\x02"],
            "nested": ({"deep": [r]},), "t": torch.full((2, 2), float(r))}


def same(a, b):
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and
                a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b))
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a.keys()) == list(b.keys()) and all(same(a[k], b[k]) for k in a)
    return a == b


def run(rank, world):
    def expect(what, got, want):
        if not same(got, want):
            sys.exit(f"torch rank {rank}: {what}: got {got!r:.300}, want {want!r:.300}")

    objs = [None] * world
    dist.all_gather_object(objs, obj(rank))
    for p in range(world):
        expect(f"all_gather_object[{p}]", objs[p], obj(p))

    gathered = [None] * world if rank == world - 1 else None
    dist.gather_object("g" * (rank * 100), gathered, dst=world - 1)
    if rank == world - 1:
        for p in range(world):
            expect(f"gather_object[{p}]", gathered[p], "g" * (p * 100))

    src = world - 1
    lst = [obj(src), "x", []] if rank == src else [None, None, None]
    dist.broadcast_object_list(lst, src=src)
    expect("broadcast_object_list", lst, [obj(src), "x", []])

    scatter_src = 1 % world
    out = [None]
    dist.scatter_object_list(out, [[p, obj(p)] for p in range(world)] if rank == scatter_src
                             else None, src=scatter_src)
    expect("scatter_object_list", out[0], [rank, obj(rank)])

    peer = rank + 1 if rank % 2 == 0 else rank - 1
    if peer < world:
        got = [None, None]
        if rank % 2 == 0:
            send_object_list([obj(rank), rank], peer)
            recv_object_list(got, peer)
        else:
            recv_object_list(got, peer)
            send_object_list([obj(rank), rank], peer)
        expect("recv_object_list", got, [obj(peer), peer])
    dist.barrier()


def main():
    path, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    store = EmberFileStore(path)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    run(rank, world)
    dist.destroy_process_group()
    store.close()
    print(f"torch rank {rank}: every object matched")


if __name__ == "__main__":
    main()
