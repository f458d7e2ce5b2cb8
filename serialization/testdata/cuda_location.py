"""PyTorch's side of hub/map_location_test: checkpoints whose storages claim
a CUDA device, made without one, and what torch.load makes of them.

  cuda_location.py save PATH LEGACY   torch.save of tensors() with every
                                      storage tagged 'cuda:0' (LEGACY 1: the
                                      pre-1.6 format)
  cuda_location.py load_error PATH    prints the error torch.load(PATH) gives
                                      without map_location
  cuda_location.py load_cpu PATH      torch.load(PATH, map_location='cpu');
                                      exit 1 unless it holds tensors()

Exit status 77 when torch is not installed.
"""
import sys

try:
    import torch
    import torch.serialization
except ImportError:
    sys.exit(77)


def tensors():
    return {
        "w": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "b": torch.tensor([1.5, -2.0], dtype=torch.float64),
    }


def main():
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "save":
        # torch.save asks location_tag for each storage's tag: a CPU storage
        # that says it lives on cuda:0, as one saved on a GPU would.
        torch.serialization.location_tag = lambda storage: "cuda:0"
        legacy = sys.argv[3] == "1"
        torch.save(tensors(), path, _use_new_zipfile_serialization=not legacy)
    elif mode == "load_error":
        try:
            torch.load(path)
        except RuntimeError as e:
            print(str(e))
            return 0
        print("no error")
        return 1
    elif mode == "load_cpu":
        got = torch.load(path, map_location="cpu")
        want = tensors()
        if set(got) != set(want):
            print("keys", sorted(got))
            return 1
        for k in want:
            if got[k].device.type != "cpu" or not torch.equal(got[k], want[k]):
                print("tensor", k, got[k])
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
