"""PyTorch 2.x's TCPStore beside Ember's (tcp_store_torch_test.cc).

  torch_store.py client PORT          a PyTorch client of Ember's server
  torch_store.py server LIBUV         PyTorch's server (libuv: 1 or 0), with
                                      an Ember client; prints its port first

Each side checks what the other wrote and exits non-zero on a mismatch.
"""
import sys
from datetime import timedelta

import torch.distributed as dist

TIMEOUT = timedelta(seconds=60)


def expect(what, got, want):
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def client(port):
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT,
                          wait_for_workers=False)
    expect("get of Ember's key", store.get("cc/hello"), b"from ember")
    store.set("py/k", b"from torch")
    expect("add", store.add("py/n", 5), 5)
    expect("add on Ember's counter", store.add("cc/n", 1), 4)
    expect("compare_set", store.compare_set("py/cas", "", "first"), b"first")
    expect("check present", store.check(["py/k", "cc/hello"]), True)
    expect("check absent", store.check(["py/absent"]), False)
    try:
        store.wait(["py/absent"], timedelta(milliseconds=100))
        raise AssertionError("wait for an absent key returned")
    except dist.DistStoreError:
        pass
    store.append("py/log", b"a")
    store.append("py/log", b"b")
    store.multi_set(["py/m1", "py/m2"], [b"1", b"2"])
    expect("multi_get", store.multi_get(["py/m2", "py/m1"]), [b"2", b"1"])
    expect("delete_key", store.delete_key("py/m2"), True)
    expect("queue_pop of Ember's push", store.queue_pop("cc/q"), b"queued by ember")
    store.queue_push("py/q", b"queued by torch")
    expect("queue_len", store.queue_len("py/q"), 1)
    store.set("py/done", b"1")
    expect("Ember's verdict", store.get("cc/verdict"), b"ok")
    print("ok", flush=True)


def server(libuv):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT,
                          wait_for_workers=False, use_libuv=libuv)
    store.set("py/hello", b"from torch")
    store.set("py/text", b"not a number")
    if libuv:  # the classic server has no queues
        store.queue_push("py/q", b"queued by torch")
    print(store.port, flush=True)
    store.wait(["cc/done"])
    expect("Ember's set", store.get("cc/k"), b"from ember")
    expect("Ember's add", store.get("cc/n"), b"7")
    expect("Ember's compare_set", store.get("cc/cas"), b"second")
    expect("Ember's append", store.get("cc/log"), b"ab")
    expect("Ember's multi_set", store.multi_get(["cc/m1", "cc/m2"]), [b"x", b"y"])
    expect("Ember's delete_key", store.check(["cc/deleted"]), False)
    if libuv:
        expect("Ember's queue_push", store.queue_pop("cc/q"), b"queued by ember")
    store.set("py/verified", b"1")
    store.wait(["cc/exit"])
    print("ok", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "client":
        client(int(sys.argv[2]))
    else:
        server(sys.argv[2] == "1")
