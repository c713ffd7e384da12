#!/usr/bin/env python3
"""check_llama_export.py HF_DIR FIXTURE: `loom ckpt export` of a loom.llama checkpoint
holding tests/fixtures/llama_tiny.bin's initial parameters, against the fixture.

HF_DIR holds model.safetensors and config.json. Checks: config.json's Llama fields; the
tensor names are exactly Hugging Face LlamaForCausalLM's (model.embed_tokens.weight,
model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
mlp.{gate,up,down}_proj}.weight, model.norm.weight, lm_head.weight), with HF's shapes (the
vocabulary without padding rows); every value bitwise the fixture's fp32 parameter; and
Hugging Face's forward (rotate_half RoPE, repeat_kv), written against those names and the
config alone, gives the fixture's logits (so q/k need no permutation). Plain-Python
safetensors reader (struct + json): Debian has no python3-safetensors.
Names, shapes, config and the bitwise values need only Python's standard library, so they
are checked on a fresh machine too; the forward needs torch (and numpy) and is skipped, with
a line that says so, where /usr/bin/python3 has neither (scripts/setup-deps --bench).
"""
import json
import math
import os
import struct
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError:
    np = None


class Tensor:
    """A little-endian array's raw bytes and shape: enough to compare names, shapes and bits."""

    def __init__(self, raw, shape, dtype):
        self.raw, self.shape, self.dtype = raw, tuple(shape), dtype

    def rows(self, n):
        """The first n rows (along the first axis)."""
        per = len(self.raw) // self.shape[0]
        return Tensor(self.raw[:n * per], (n,) + self.shape[1:], self.dtype)

    def array(self):
        return np.frombuffer(self.raw, self.dtype).reshape(self.shape)


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, t in header.items():
        if t["dtype"] != "F32":
            fail(f"{name}: dtype {t['dtype']}, want F32")
        a, b = t["data_offsets"]
        if b - a != 4 * math.prod(t["shape"]):
            fail(f"{name}: {b - a} bytes for shape {t['shape']}")
        out[name] = Tensor(data[8 + n + a:8 + n + b], t["shape"], "<f4")
    return out


def read_fixture(path):
    with open(path, "rb") as f:
        data = f.read()
    h = struct.unpack_from("<16i", data, 0)
    if h[0] != 20261201:
        fail(f"{path} is not the llama fixture (magic {h[0]})")
    V, Vp, maxT, L, NH, C, B, T, n_params, _, KVH, FF = h[2:14]
    hyper = struct.unpack_from("<8f", data, 64)
    off = 96
    init = data[off:off + 4 * n_params]; off += 4 * n_params
    tokens = Tensor(data[off:off + 4 * B * T], (B, T), "<i4"); off += 4 * B * T
    off += 4 * B * T  # targets
    logits = Tensor(data[off:off + 4 * B * T * Vp], (B, T, Vp), "<f4")
    cfg = dict(V=V, Vp=Vp, maxT=maxT, L=L, NH=NH, C=C, KVH=KVH, FF=FF, theta=hyper[5],
               eps=hyper[6])
    return cfg, init, tokens, logits


def fixture_params(cfg, init):
    """The fixture's flat parameters (loom order) under Hugging Face's names."""
    C, HS = cfg["C"], cfg["C"] // cfg["NH"]
    KV, FF, Vp, V = cfg["KVH"] * HS, cfg["FF"], cfg["Vp"], cfg["V"]
    specs = [("model.embed_tokens.weight", (Vp, C))]
    for l in range(cfg["L"]):
        p = f"model.layers.{l}."
        specs += [(p + "input_layernorm.weight", (C,)), (p + "self_attn.q_proj.weight", (C, C)),
                  (p + "self_attn.k_proj.weight", (KV, C)), (p + "self_attn.v_proj.weight", (KV, C)),
                  (p + "self_attn.o_proj.weight", (C, C)),
                  (p + "post_attention_layernorm.weight", (C,)),
                  (p + "mlp.gate_proj.weight", (FF, C)), (p + "mlp.up_proj.weight", (FF, C)),
                  (p + "mlp.down_proj.weight", (C, FF))]
    specs += [("model.norm.weight", (C,)), ("lm_head.weight", (Vp, C))]
    out, off = {}, 0
    for name, shape in specs:
        n = math.prod(shape)
        a = Tensor(init[4 * off:4 * (off + n)], shape, "<f4")
        off += n
        out[name] = a.rows(V) if name in ("model.embed_tokens.weight", "lm_head.weight") else a
    assert 4 * off == len(init)
    return out


def dense_mlp(t, p, h):
    """LlamaMLP: down(silu(gate(h)) * up(h))."""
    h = F.silu(F.linear(h, t[p + "mlp.gate_proj.weight"])) * F.linear(h, t[p + "mlp.up_proj.weight"])
    return F.linear(h, t[p + "mlp.down_proj.weight"])


def hf_forward(W, conf, tok, mlp=dense_mlp):
    """LlamaForCausalLM's forward (float64) from HF names and config.json only; tok is a
    (B, T) int64 torch tensor; mlp(t, prefix, h) is the block's MLP (check_mixtral_export
    passes Mixtral's sparse MoE block)."""
    t = {k: torch.tensor(v.array().astype(np.float64)) for k, v in W.items()}
    NH, KVH, C = conf["num_attention_heads"], conf["num_key_value_heads"], conf["hidden_size"]
    HS, eps, L = C // NH, conf["rms_norm_eps"], conf["num_hidden_layers"]
    Bn, Tn = tok.shape

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rotate_half(x):
        return torch.cat((-x[..., HS // 2:], x[..., : HS // 2]), dim=-1)

    inv = 1.0 / (conf["rope_theta"] ** (torch.arange(0, HS, 2, dtype=torch.float64) / HS))
    emb = torch.cat([torch.outer(torch.arange(Tn, dtype=torch.float64), inv)] * 2, dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.ones(Tn, Tn, dtype=torch.bool).tril()
    x = t["model.embed_tokens.weight"][tok]
    for l in range(L):
        p = f"model.layers.{l}."
        h = rms(x, t[p + "input_layernorm.weight"])
        q = F.linear(h, t[p + "self_attn.q_proj.weight"]).view(Bn, Tn, NH, HS).transpose(1, 2)
        k = F.linear(h, t[p + "self_attn.k_proj.weight"]).view(Bn, Tn, KVH, HS).transpose(1, 2)
        v = F.linear(h, t[p + "self_attn.v_proj.weight"]).view(Bn, Tn, KVH, HS).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(NH // KVH, dim=1), v.repeat_interleave(NH // KVH, dim=1)
        att = ((q @ k.transpose(-2, -1)) / math.sqrt(HS)).masked_fill(~mask, float("-inf"))
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(Bn, Tn, C)
        x = x + F.linear(y, t[p + "self_attn.o_proj.weight"])
        x = x + mlp(t, p, rms(x, t[p + "post_attention_layernorm.weight"]))
    head = t["model.embed_tokens.weight"] if conf["tie_word_embeddings"] else t["lm_head.weight"]
    return F.linear(rms(x, t["model.norm.weight"]), head)


def main():
    hf_dir, fixture = sys.argv[1], sys.argv[2]
    cfg, init, tokens, logits = read_fixture(fixture)
    with open(os.path.join(hf_dir, "config.json")) as f:
        conf = json.load(f)
    want = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": cfg["V"],
            "hidden_size": cfg["C"], "intermediate_size": cfg["FF"],
            "num_hidden_layers": cfg["L"], "num_attention_heads": cfg["NH"],
            "num_key_value_heads": cfg["KVH"], "max_position_embeddings": cfg["maxT"],
            "tie_word_embeddings": False, "hidden_act": "silu"}
    for k, v in want.items():
        if conf.get(k) != v:
            fail(f"config.json {k} = {conf.get(k)!r}, want {v!r}")
    if abs(conf["rms_norm_eps"] - cfg["eps"]) > 1e-12 or conf["rope_theta"] != cfg["theta"]:
        fail(f"config.json rms_norm_eps/rope_theta {conf['rms_norm_eps']}/{conf['rope_theta']}")
    got = read_safetensors(os.path.join(hf_dir, "model.safetensors"))
    ref = fixture_params(cfg, init)
    if set(got) != set(ref):
        fail(f"names differ: extra {sorted(set(got) - set(ref))}, missing {sorted(set(ref) - set(got))}")
    for name, a in ref.items():
        if got[name].shape != a.shape:
            fail(f"{name}: shape {got[name].shape}, want {a.shape}")
        if got[name].raw != a.raw:
            at = next(i for i in range(0, len(a.raw), 4) if got[name].raw[i:i + 4] != a.raw[i:i + 4])
            fail(f"{name}: values differ from the fixture (first at element {at // 4})")
    print(f"ok {len(got)} tensors: Hugging Face names, shapes and values bitwise the fixture's")
    if np is None:
        print("skipped: Hugging Face's forward on the export (needs torch and numpy in "
              f"{sys.executable}; scripts/setup-deps --bench installs them)")
        return
    out = hf_forward(got, conf, torch.tensor(tokens.array().astype(np.int64))).numpy()
    d = np.abs(out - logits.array()[..., :cfg["V"]].astype(np.float64)).max()
    if not d < 1e-5:
        fail(f"Hugging Face's forward on the exported weights differs from the fixture's logits by {d}")
    print(f"ok Hugging Face's forward (rotate_half RoPE, repeat_kv) on the export: logits within {d:.2g} of the fixture")


if __name__ == "__main__":
    main()
