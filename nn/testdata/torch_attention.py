"""PyTorch's side of nn/attention_torch_test.cc.

    torch_attention.py OUT_DIR
    torch_attention.py load DIR

Writes OUT_DIR/<case>.pt for every case below: a flat dict of tensors with
the case's inputs ("in.<name>"), the module's state dict ("state.<key>"),
the output gradient "gy", torch's outputs ("out", "weights") and the
gradients of (out * gy).sum() with respect to the inputs ("grad.in.<name>")
and the parameters ("grad.state.<key>"). The test reads them with
ember::load, runs Ember's counterpart on the same inputs and weights, and
compares. Each case exists in float32 and float64 (suffix _f32 / _f64).

"load DIR" loads the state dicts Ember wrote there (ember::save) into the
matching torch modules with strict=True, checks every value arrived, and
prints "loaded N".
"""

import sys

import torch
import torch.nn.functional as F

OUT = sys.argv[-1]


def leaf(t):
    return t.detach().clone().requires_grad_(t.is_floating_point())


def write(name, inputs, outputs, module=None, extra=None):
    """outputs: (out, weights or None) computed from `inputs` (leaves)."""
    out, weights = outputs
    gy = torch.randn_like(out)
    params = dict(module.named_parameters()) if module is not None else {}
    diff = [t for t in inputs.values() if t.requires_grad] + list(params.values())
    grads = torch.autograd.grad((out * gy).sum(), diff, allow_unused=True)
    record = {"gy": gy, "out": out.detach()}
    if weights is not None:
        record["weights"] = weights.detach()
    for key, t in inputs.items():
        record[f"in.{key}"] = t.detach()
    for key, t in params.items():
        record[f"state.{key}"] = t.detach()
    names = [f"grad.in.{k}" for k, t in inputs.items() if t.requires_grad]
    names += [f"grad.state.{k}" for k in params]
    for key, g in zip(names, grads):
        if g is not None:
            record[key] = g
    record.update(extra or {})
    torch.save({k: v.contiguous().clone() for k, v in record.items()}, f"{OUT}/{name}.pt")


def sdpa_cases(dtype, suffix):
    opts = {"dtype": dtype}
    # name: (q shape, k shape, v shape, mask kind, causal, gqa)
    cases = {
        "sdpa_plain": ((2, 3, 70, 16), (2, 3, 130, 16), (2, 3, 130, 24), None, False, False),
        "sdpa_causal": ((1, 2, 100, 8), (1, 2, 75, 8), (1, 2, 75, 8), None, True, False),
        "sdpa_bool": ((2, 2, 65, 8), (2, 2, 67, 8), (2, 2, 67, 8), "bool", False, False),
        "sdpa_float": ((2, 2, 33, 16), (2, 2, 129, 16), (2, 2, 129, 16), "float", False, False),
        "sdpa_gqa": ((2, 6, 40, 16), (2, 2, 90, 16), (2, 2, 90, 8), None, False, True),
    }
    for name, (qs, ks, vs, mask_kind, causal, gqa) in cases.items():
        inputs = {
            "q": leaf(torch.randn(qs, **opts)),
            "k": leaf(torch.randn(ks, **opts)),
            "v": leaf(torch.randn(vs, **opts)),
        }
        mask = None
        if mask_kind == "bool":
            mask = torch.rand(qs[-2], ks[-2]) > 0.3
            mask[3] = False  # a fully masked row
        elif mask_kind == "float":
            mask = torch.randn(qs[0], 1, qs[-2], ks[-2], **opts)
        if mask is not None:
            inputs["mask"] = mask
        out = F.scaled_dot_product_attention(
            inputs["q"], inputs["k"], inputs["v"], attn_mask=mask, is_causal=causal,
            enable_gqa=gqa)
        write(name + suffix, inputs, (out, None))


def mha_cases(dtype, suffix):
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True).to(dtype)
    x = leaf(torch.randn(2, 5, 16, dtype=dtype))
    padding = torch.zeros(2, 5, dtype=torch.bool)
    padding[1, 4] = True
    causal = torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=dtype)
    out, weights = mha(x, x, x, key_padding_mask=padding, attn_mask=causal)
    write("mha_weights" + suffix, {"x": x, "padding": padding, "causal": causal},
          (out, weights), mha)
    x = leaf(x)
    out, _ = mha(x, x, x, key_padding_mask=padding, attn_mask=causal, need_weights=False)
    write("mha_sdpa" + suffix, {"x": x, "padding": padding, "causal": causal}, (out, None), mha)

    cross = torch.nn.MultiheadAttention(8, 2, kdim=5, vdim=3).to(dtype)
    q = leaf(torch.randn(4, 2, 8, dtype=dtype))
    k = leaf(torch.randn(6, 2, 5, dtype=dtype))
    v = leaf(torch.randn(6, 2, 3, dtype=dtype))
    out, weights = cross(q, k, v, average_attn_weights=False)
    write("mha_cross" + suffix, {"q": q, "k": k, "v": v}, (out, weights), cross)


def layer_cases(dtype, suffix):
    post = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0).to(dtype)
    src = leaf(torch.randn(5, 2, 16, dtype=dtype))
    causal = torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=dtype)
    out = post(src, src_mask=causal)
    write("encoder_layer_post" + suffix, {"src": src, "causal": causal}, (out, None), post)

    pre = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True).to(dtype)
    src = leaf(torch.randn(2, 5, 16, dtype=dtype))
    padding = torch.zeros(2, 5, dtype=torch.bool)
    padding[0, 3:] = True
    out = pre(src, src_key_padding_mask=padding)
    write("encoder_layer_pre" + suffix, {"src": src, "padding": padding}, (out, None), pre)

    dec = torch.nn.TransformerDecoderLayer(16, 4, 32, dropout=0.0).to(dtype)
    tgt = leaf(torch.randn(5, 2, 16, dtype=dtype))
    memory = leaf(torch.randn(7, 2, 16, dtype=dtype))
    mpad = torch.zeros(2, 7, dtype=torch.bool)
    mpad[1, 5:] = True
    out = dec(tgt, memory, tgt_mask=causal, memory_key_padding_mask=mpad, tgt_is_causal=True)
    write("decoder_layer" + suffix, {"tgt": tgt, "memory": memory, "causal": causal,
                                     "mpad": mpad}, (out, None), dec)

    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 2, norm=torch.nn.LayerNorm(16),
                                          enable_nested_tensor=False).to(dtype)
    src = leaf(torch.randn(2, 5, 16, dtype=dtype))
    out = encoder(src, mask=causal)
    write("encoder" + suffix, {"src": src, "causal": causal}, (out, None), encoder)


def load_ember(directory):
    modules = {
        "ember_mha_cross.pt": torch.nn.MultiheadAttention(8, 2, kdim=5, vdim=3),
        "ember_encoder.pt": torch.nn.TransformerEncoder(
            torch.nn.TransformerEncoderLayer(16, 4, 32), 2, norm=torch.nn.LayerNorm(16),
            enable_nested_tensor=False),
        "ember_decoder_nobias.pt": torch.nn.TransformerDecoderLayer(16, 4, 32, bias=False),
    }
    for file, module in modules.items():
        state = torch.load(f"{directory}/{file}")
        module.load_state_dict(state, strict=True)
        for key, value in module.state_dict().items():
            if not torch.equal(value, state[key]):
                raise SystemExit(f"{file}: {key} differs after loading")
    print(f"loaded {len(modules)}")


def main():
    if sys.argv[1] == "load":
        load_ember(sys.argv[2])
        return
    for dtype, suffix in ((torch.float32, "_f32"), (torch.float64, "_f64")):
        torch.manual_seed(0)
        sdpa_cases(dtype, suffix)
        mha_cases(dtype, suffix)
        layer_cases(dtype, suffix)
    print("ok")


if __name__ == "__main__":
    main()
