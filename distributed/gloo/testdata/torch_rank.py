"""One PyTorch rank of a gloo group shared with Ember ranks.

usage: torch_rank.py STORE_PATH RANK WORLD_SIZE
       torch_rank.py env RANK WORLD_SIZE

Joins through the Ember FileStore at STORE_PATH (EmberFileStore below, a
torch.distributed.Store over Ember's file format), or with "env" through
init_method env:// (MASTER_ADDR and MASTER_PORT name a TCPStore that rank 0
hosts, Ember's or PyTorch's), runs the op sequence that
distributed/gloo/torch_interop_test.cc runs on its Ember ranks, and checks
every result. Exit status: 0 when every result matched, 1 with a message on
stderr when one did not, 77 when python3-torch is missing.
"""
import fcntl
import os
import struct
import sys
import time
from datetime import timedelta

try:
    import torch
    import torch.distributed as dist
except ImportError:
    sys.exit(77)

MAGIC = b"EMBRFS01"  # distributed/file_store.cc, Note [FileStore format and locking]


class EmberFileStore(dist.Store):
    """Ember's FileStore log: records of kind, key length, value length, key,
    value, appended under a whole-file POSIX lock (which excludes Ember's OFD
    locks)."""

    def __init__(self, path, timeout=timedelta(seconds=60)):
        super().__init__()
        self.path, self.wait_timeout = path, timeout
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.offset, self.data, self.users = 0, {}, 0
        self._update(lambda: self._append(b"U", b"", b"1"))

    def _locked(self, exclusive, fn):
        fcntl.lockf(self.fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            self._refresh()
            return fn()
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN)

    def _update(self, fn):
        return self._locked(True, fn)

    def _refresh(self):
        size = os.fstat(self.fd).st_size
        if size <= self.offset:
            return
        buf = os.pread(self.fd, size - self.offset, self.offset)
        pos = 0
        if self.offset == 0:
            if len(buf) < len(MAGIC):
                return
            if buf[:8] != MAGIC:
                raise RuntimeError(f"{self.path} is not an Ember FileStore")
            pos = 8
        while pos + 9 <= len(buf):
            kind = buf[pos:pos + 1]
            klen, vlen = struct.unpack_from("<II", buf, pos + 1)
            end = pos + 9 + klen + vlen
            if end > len(buf):
                break
            key = buf[pos + 9:pos + 9 + klen].decode()
            value = buf[pos + 9 + klen:end]
            if kind == b"S":
                self.data[key] = value
            elif kind == b"D":
                self.data.pop(key, None)
            elif kind == b"U":
                self.users += int(value)
            pos = end
        self.offset += pos

    def _append(self, kind, key, value):
        record = (MAGIC if self.offset == 0 else b"") + kind + struct.pack("<II", len(key), len(value))
        os.pwrite(self.fd, record + key + value, self.offset)
        self._refresh()

    def set(self, key, value):
        value = value.encode() if isinstance(value, str) else bytes(value)
        self._update(lambda: self._append(b"S", key.encode(), value))

    def add(self, key, delta):
        def add():
            value = int(self.data.get(key, b"0")) + delta
            self._append(b"S", key.encode(), str(value).encode())
            return value
        return self._update(add)

    def check(self, keys):
        return self._locked(False, lambda: all(k in self.data for k in keys))

    def wait(self, keys, timeout=None):
        deadline = time.monotonic() + (timeout or self.wait_timeout).total_seconds()
        while not self.check(keys):
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {keys}")
            time.sleep(0.005)

    def get(self, key):
        self.wait([key])
        return self._locked(False, lambda: self.data[key])

    def close(self):
        def leave():
            self._append(b"U", b"", b"-1")
            if self.users <= 0:
                os.unlink(self.path)
        self._update(leave)
        os.close(self.fd)


def run(rank, world):
    def expect(what, got, want):
        if not torch.equal(got, want):
            sys.exit(f"torch rank {rank}: {what}: got {got.tolist()}, want {want.tolist()}")

    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    expect("all_reduce SUM", t, torch.full((5,), world * (world + 1) / 2))

    t = torch.tensor([rank * 10, -rank], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    expect("all_reduce MAX", t, torch.tensor([(world - 1) * 10, 0]))

    for src in (0, world - 1):
        t = torch.arange(6, dtype=torch.float64) + 100 * rank
        dist.broadcast(t, src)
        expect(f"broadcast from {src}", t, torch.arange(6, dtype=torch.float64) + 100 * src)

    outs = [torch.zeros(3, dtype=torch.int32) for _ in range(world)]
    dist.all_gather(outs, torch.full((3,), rank, dtype=torch.int32))
    for p in range(world):
        expect(f"all_gather[{p}]", outs[p], torch.full((3,), p, dtype=torch.int32))

    t = torch.full((4,), float(rank))
    dist.reduce(t, dst=world - 1)
    if rank == world - 1:
        expect("reduce", t, torch.full((4,), float(sum(range(world)))))

    mine = torch.full((2,), float(rank * rank))
    if rank == 0:
        outs = [torch.zeros(2) for _ in range(world)]
        dist.gather(mine, outs, dst=0)
        for p in range(world):
            expect(f"gather[{p}]", outs[p], torch.full((2,), float(p * p)))
    else:
        dist.gather(mine, dst=0)

    out = torch.zeros(2)
    dist.scatter(out, [torch.full((2,), 5.0 + p) for p in range(world)] if rank == 0 else None,
                 src=0)
    expect("scatter", out, torch.full((2,), 5.0 + rank))

    dist.barrier()

    sent = dist.isend(torch.full((4,), float(rank)), (rank + 1) % world, tag=7)
    got = torch.zeros(4)
    dist.recv(got, (rank - 1) % world, tag=7)
    sent.wait()
    expect("recv", got, torch.full((4,), float((rank - 1) % world)))

    pair = dist.new_group([0, 1])
    if rank in (0, 1):
        t = torch.full((2,), float(rank + 1))
        dist.all_reduce(t, group=pair)
        expect("all_reduce in new_group([0, 1])", t, torch.full((2,), 3.0))
    dist.barrier()


def main():
    path, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    store = None
    if path == "env":
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                                timeout=timedelta(seconds=60))
    else:
        store = EmberFileStore(path)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=60))
    run(rank, world)
    dist.destroy_process_group()
    if store is not None:
        store.close()
    print(f"torch rank {rank}: every result matched")


if __name__ == "__main__":
    main()
