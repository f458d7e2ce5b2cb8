#!/usr/bin/python3
"""Makes the checkpoint fixtures in this folder with Debian's python3-torch.

Run once from the repository root: /usr/bin/python3 serialization/testdata/make_fixtures.py
The outputs are committed; the tests only read them.

  tensors.pt            torch.save of an OrderedDict: every dtype Ember has,
                        a 0-dim tensor, and views sharing one storage with an
                        offset and transposed strides
  tensors.safetensors   the same tensors (contiguous), written per the
                        safetensors spec by hand (the safetensors package is
                        not in Debian)
  tensors.expected.txt  one line per tensor: name dtype sizes values
  tensors_legacy.pt     the same OrderedDict in the legacy (pre-1.6, non-zip)
                        torch.save format
  complex.pt            a state_dict holding a complex64 tensor (a dtype
                        Ember lacks)
  evil_*.pt, truncated.pt  hostile checkpoints (see each writer below)
"""
import collections
import io
import json
import os
import struct
import zipfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def tensors():
    g = torch.Generator().manual_seed(0)
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 4
    sd = collections.OrderedDict()
    sd["linear.weight"] = torch.randn(4, 3, generator=g)
    sd["linear.bias"] = torch.randn(4, generator=g).double()
    sd["bn.num_batches_tracked"] = torch.tensor(7)
    sd["half"] = torch.tensor([1.5, -2.0, 65504.0], dtype=torch.float16)
    sd["bfloat"] = torch.tensor([0.5, -3.0], dtype=torch.bfloat16)
    sd["int32"] = torch.tensor([[1, -2], [3, 2147483647]], dtype=torch.int32)
    sd["int16"] = torch.tensor([-32768, 5], dtype=torch.int16)
    sd["int8"] = torch.tensor([-128, 127], dtype=torch.int8)
    sd["uint8"] = torch.tensor([0, 255], dtype=torch.uint8)
    sd["bool"] = torch.tensor([True, False, True])
    sd["view.rows"] = base[1:]            # offset 4 into the shared storage
    sd["view.transposed"] = base.t()      # strides (1, 4)
    sd["empty"] = torch.zeros(0, 3)
    return sd


def write_expected(sd):
    with open(os.path.join(HERE, "tensors.expected.txt"), "w") as f:
        for name, t in sd.items():
            dtype = str(t.dtype).replace("torch.", "")
            sizes = ",".join(str(s) for s in t.shape) or "-"
            values = " ".join(repr(float(v)) for v in t.reshape(-1).tolist())
            f.write(f"{name} {dtype} {sizes} {values}\n")


ST_DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
             torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
             torch.uint8: "U8", torch.bool: "BOOL"}


def write_safetensors(sd, path):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in sd.items():
        data = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def zip_checkpoint(path, pickle_bytes, records):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        for key, data in records.items():
            z.writestr(f"archive/data/{key}", data)
        z.writestr("archive/version", "3\n")


def u(s):  # BINUNICODE
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def rebuild(storage_key, numel, offset, size, stride, storage_type=b"FloatStorage"):
    """A _rebuild_tensor_v2 call as torch.save writes it (protocol 2)."""
    tup = lambda xs: b"(" + b"".join(b"J" + struct.pack("<i", x) for x in xs) + b"t"
    return (b"ctorch._utils\n_rebuild_tensor_v2\n(" +
            b"(" + u("storage") + b"ctorch\n" + storage_type + b"\n" + u(storage_key) + u("cpu") +
            b"J" + struct.pack("<i", numel) + b"tQ" +
            b"J" + struct.pack("<i", offset) + tup(size) + tup(stride) +
            b"\x89ccollections\nOrderedDict\n)Rt" + b"R")


def state_dict_pickle(items):
    return b"\x80\x02ccollections\nOrderedDict\n)R(" + b"".join(u(k) + v for k, v in items) + b"u."


def hostile():
    floats = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
    # A global outside the allowed set, called: the classic code-execution payload.
    zip_checkpoint(os.path.join(HERE, "evil_global.pt"),
                   b"\x80\x02cos\nsystem\n" + u("touch /tmp/ember_pwned") + b"\x85R.", {})
    # An allowed global that is not a callable the format uses (a storage
    # class may only appear inside a persistent id).
    zip_checkpoint(os.path.join(HERE, "evil_reduce.pt"),
                   state_dict_pickle([("w", b"ctorch\nFloatStorage\n)R")]), {})
    # An opcode outside the set torch.save emits (INST).
    zip_checkpoint(os.path.join(HERE, "evil_opcode.pt"),
                   b"\x80\x02(ibuiltins\nprint\n.", {})
    # The storage record is shorter than the numel the pickle claims.
    zip_checkpoint(os.path.join(HERE, "evil_storage_size.pt"),
                   state_dict_pickle([("w", rebuild("0", 6, 0, [2, 3], [3, 1]))]), {"0": floats[:8]})
    # A view reaching past the end of its storage.
    zip_checkpoint(os.path.join(HERE, "evil_view.pt"),
                   state_dict_pickle([("w", rebuild("0", 6, 2, [2, 3], [3, 1]))]), {"0": floats})
    # A negative stride.
    zip_checkpoint(os.path.join(HERE, "evil_stride.pt"),
                   state_dict_pickle([("w", rebuild("0", 6, 5, [6], [-1]))]), {"0": floats})
    # A cut download.
    data = open(os.path.join(HERE, "tensors.pt"), "rb").read()
    open(os.path.join(HERE, "truncated.pt"), "wb").write(data[: len(data) // 2])


def legacy_and_unsupported(sd):
    torch.save(sd, os.path.join(HERE, "tensors_legacy.pt"), _use_new_zipfile_serialization=False)
    torch.save(collections.OrderedDict(z=torch.tensor([1 + 2j], dtype=torch.complex64)),
               os.path.join(HERE, "complex.pt"))


def main():
    sd = tensors()
    torch.save(sd, os.path.join(HERE, "tensors.pt"))
    write_safetensors(sd, os.path.join(HERE, "tensors.safetensors"))
    write_expected(sd)
    hostile()
    legacy_and_unsupported(sd)
    # Sanity: PyTorch's own restricted loader reads the good file back.
    back = torch.load(os.path.join(HERE, "tensors.pt"), weights_only=True)
    assert all(torch.equal(back[k], sd[k]) for k in sd)


if __name__ == "__main__":
    main()
