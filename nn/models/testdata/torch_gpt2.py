"""PyTorch's side of nn/models/gpt2_test.cc: a small GPT-2 written in torch
with Hugging Face's GPT2LMHeadModel layout (Conv1D weights [in, out], the LM
head tied to wte), its weights written as safetensors with the
"transformer." prefix, lm_head.weight and the old attention-mask buffers.

Usage: torch_gpt2.py OUT_DIR

Writes OUT_DIR/model.safetensors and OUT_DIR/expected.pt (ids [2, 11],
targets, logits in eval mode, the mean cross-entropy and the gradients of
wte, h.0.attn.c_attn.weight and h.1.mlp.c_proj.bias), then prints "done".
"""
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

VOCAB, POSITIONS, EMBD, LAYERS, HEADS = 97, 32, 48, 2, 4


def conv1d(x, w, b):
    return torch.addmm(b, x.reshape(-1, x.shape[-1]), w).reshape(*x.shape[:-1], w.shape[1])


def forward(p, ids):
    b, t = ids.shape
    x = p["wte.weight"][ids] + p["wpe.weight"][torch.arange(t)]
    for i in range(LAYERS):
        q = f"h.{i}."
        h = F.layer_norm(x, (EMBD,), p[q + "ln_1.weight"], p[q + "ln_1.bias"], 1e-5)
        qkv = conv1d(h, p[q + "attn.c_attn.weight"], p[q + "attn.c_attn.bias"])
        qh, kh, vh = (qkv[..., j * EMBD:(j + 1) * EMBD].reshape(b, t, HEADS, EMBD // HEADS)
                      .transpose(1, 2) for j in range(3))
        a = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
        a = a.transpose(1, 2).reshape(b, t, EMBD)
        x = x + conv1d(a, p[q + "attn.c_proj.weight"], p[q + "attn.c_proj.bias"])
        h = F.layer_norm(x, (EMBD,), p[q + "ln_2.weight"], p[q + "ln_2.bias"], 1e-5)
        m = F.gelu(conv1d(h, p[q + "mlp.c_fc.weight"], p[q + "mlp.c_fc.bias"]), approximate="tanh")
        x = x + conv1d(m, p[q + "mlp.c_proj.weight"], p[q + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (EMBD,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    return x @ p["wte.weight"].t()


def params():
    g = torch.Generator().manual_seed(0)
    def n(*shape, std=0.02):
        return torch.randn(*shape, generator=g) * std
    p = {"wte.weight": n(VOCAB, EMBD), "wpe.weight": n(POSITIONS, EMBD, std=0.01)}
    for i in range(LAYERS):
        q = f"h.{i}."
        for ln in ("ln_1", "ln_2"):
            p[q + ln + ".weight"] = 1 + n(EMBD, std=0.1)
            p[q + ln + ".bias"] = n(EMBD, std=0.1)
        p[q + "attn.c_attn.weight"] = n(EMBD, 3 * EMBD)
        p[q + "attn.c_attn.bias"] = n(3 * EMBD)
        p[q + "attn.c_proj.weight"] = n(EMBD, EMBD)
        p[q + "attn.c_proj.bias"] = n(EMBD)
        p[q + "mlp.c_fc.weight"] = n(EMBD, 4 * EMBD)
        p[q + "mlp.c_fc.bias"] = n(4 * EMBD)
        p[q + "mlp.c_proj.weight"] = n(4 * EMBD, EMBD)
        p[q + "mlp.c_proj.bias"] = n(EMBD)
    p["ln_f.weight"] = 1 + n(EMBD, std=0.1)
    p["ln_f.bias"] = n(EMBD, std=0.1)
    return p


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main():
    out = sys.argv[1]
    p = params()
    on_disk = {"transformer." + k: v for k, v in p.items()}
    on_disk["lm_head.weight"] = p["wte.weight"]
    for i in range(LAYERS):  # the causal-mask buffer older checkpoints carry
        on_disk[f"transformer.h.{i}.attn.bias"] = torch.tril(
            torch.ones(POSITIONS, POSITIONS)).view(1, 1, POSITIONS, POSITIONS)
    write_safetensors(os.path.join(out, "model.safetensors"), on_disk)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, 11), generator=g)
    targets = torch.randint(0, VOCAB, (2, 11), generator=g)
    for v in p.values():
        v.requires_grad_(True)
    logits = forward(p, ids)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    loss.backward()
    torch.save({"ids": ids, "targets": targets, "logits": logits.detach(),
                "loss": loss.detach(),
                "grad_wte": p["wte.weight"].grad,
                "grad_c_attn": p["h.0.attn.c_attn.weight"].grad,
                "grad_c_proj_bias": p["h.1.mlp.c_proj.bias"].grad},
               os.path.join(out, "expected.pt"))
    print("done")


if __name__ == "__main__":
    main()
