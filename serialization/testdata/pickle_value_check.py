"""PyTorch's side of serialization/pickle_value_test.

usage: pickle_value_check.py load CASE FILE   FILE holds Ember's pickle of CASE:
                                              pickle.loads must give CASE's value
                                              and pickle.dumps of it the same bytes
       pickle_value_check.py dump DIR         writes torch's pickle of each CASE
                                              of TORCH_CASES to DIR/CASE.pkl

Exit status 0 when everything matched, 1 with a message otherwise, 77 when
torch is missing.
"""
import collections
import os
import pickle
import sys

try:
    import torch
except ImportError:
    sys.exit(77)


def cases():
    return {
        "scalars": [None, True, False, 0, -1, 255, 256, 65535, 65536, 2**31, -2**31 - 1,
                    2**63 - 1, -2**63, 1.5, -0.0, "", "ünïcödé", b"", b"\x00\xff"],
        "nested": {"a": [1, [2, [3, []]]], "b": (None, ("x",), (1, 2, 3, 4)), 7: {"k": {}}},
        # Several frames, and a payload written outside them.
        "big": {"words": ["w%d" % i for i in range(30000)], "blob": b"\x5a" * (3 << 20),
                "text": "t" * 100000, "many": list(range(2500))},
        "tensor": {"f": torch.arange(6, dtype=torch.float32).reshape(2, 3),
                   "i": torch.tensor([-3, 4], dtype=torch.int64),
                   "scalar": torch.tensor(2.5, dtype=torch.float64)},
    }


# What torch itself pickles, for Ember to read.
TORCH_CASES = {
    "tensor_view": lambda: {"v": torch.arange(10, dtype=torch.int32)[2:8:2]},
    "ordered": lambda: collections.OrderedDict([("z", 1), ("a", [2.5, None])]),
    "parameter": lambda: torch.nn.Parameter(torch.ones(2, 2, dtype=torch.float64)),
    "bool_tensor": lambda: [torch.tensor([True, False, True])],
}


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
    if isinstance(a, float):
        return repr(a) == repr(b)
    return a == b


def main():
    if sys.argv[1] == "load":
        name, path = sys.argv[2], sys.argv[3]
        data = open(path, "rb").read()
        got, want = pickle.loads(data), cases()[name]
        if not same(got, want):
            sys.exit(f"{name}: Ember's pickle loads as {got!r:.300}, want {want!r:.300}")
        if name != "tensor" and pickle.dumps(want) != data:
            sys.exit(f"{name}: Ember's bytes differ from pickle.dumps's")
        print(f"{name}: ok")
    elif sys.argv[1] == "dump":
        for name, make in TORCH_CASES.items():
            with open(os.path.join(sys.argv[2], name + ".pkl"), "wb") as f:
                pickle.dump(make(), f)
        print("dumped")


if __name__ == "__main__":
    main()
