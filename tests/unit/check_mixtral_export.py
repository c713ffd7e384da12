#!/usr/bin/env python3
"""check_mixtral_export.py HF_DIR CKPT_MODEL TEXT VAL_FRACTION BxT LOSS: `loom ckpt export` of a loom.llama
checkpoint with moe (every block MoE) in Hugging Face MixtralForCausalLM's layout.

HF_DIR holds model.safetensors and config.json; CKPT_MODEL is the checkpoint's own
model.safetensors (loom's logical names, one rank). Checks: config.json's Mixtral fields
(model_type "mixtral", num_local_experts, num_experts_per_tok); the names are exactly
Mixtral's (model.layers.N.block_sparse_moe.gate.weight for loom's h.N.moe.router.weight,
...experts.E.w1/w3/w2.weight for h.N.moe.expert.E.gate/up/proj.weight, the attention and
norms as Llama's), with HF's shapes, every value bitwise the checkpoint's; and Hugging
Face's Mixtral forward (MixtralSparseMoeBlock: softmax over all experts, top-k, the chosen
renormalised; w2(silu(w1 x) * w3 x)), written against those names and config.json alone,
gives on the first val batch (B x T bytes of TEXT's val split, data_text.c's split) the
cross-entropy LOSS loom evaluated on the saved weights, within 1e-5.
Names, shapes, config and values need only the standard library; the forward needs torch
and numpy and is skipped, with a line that says so, where they are missing.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_llama_export import fail, hf_forward, read_safetensors  # noqa: E402

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError:
    np = None


def hf_names(L, E):
    """loom logical name -> Mixtral's name."""
    m = {"wte": "model.embed_tokens.weight", "ln_f.weight": "model.norm.weight",
         "lm_head.weight": "lm_head.weight"}
    per = {"ln_1.weight": "input_layernorm.weight", "attn.q.weight": "self_attn.q_proj.weight",
           "attn.k.weight": "self_attn.k_proj.weight", "attn.v.weight": "self_attn.v_proj.weight",
           "attn.proj.weight": "self_attn.o_proj.weight",
           "ln_2.weight": "post_attention_layernorm.weight",
           "moe.router.weight": "block_sparse_moe.gate.weight"}
    for e in range(E):
        per.update({f"moe.expert.{e}.gate.weight": f"block_sparse_moe.experts.{e}.w1.weight",
                    f"moe.expert.{e}.up.weight": f"block_sparse_moe.experts.{e}.w3.weight",
                    f"moe.expert.{e}.proj.weight": f"block_sparse_moe.experts.{e}.w2.weight"})
    for l in range(L):
        for k, v in per.items():
            m[f"h.{l}.{k}"] = f"model.layers.{l}.{v}"
    return m


def sparse_moe(conf):
    """MixtralSparseMoeBlock as an mlp for check_llama_export.hf_forward: the router's
    softmax, top-k, the chosen gates renormalised, the chosen experts' w2(silu(w1 h) * w3 h)
    summed with them."""
    E, K = conf["num_local_experts"], conf["num_experts_per_tok"]

    def mlp(t, p, h):
        shape = h.shape
        h = h.reshape(-1, shape[-1])
        probs = F.linear(h, t[p + "block_sparse_moe.gate.weight"]).softmax(-1)
        w, sel = probs.topk(K, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(h)
        for e in range(E):
            q_ = p + f"block_sparse_moe.experts.{e}."
            ye = F.linear(F.silu(F.linear(h, t[q_ + "w1.weight"])) * F.linear(h, t[q_ + "w3.weight"]),
                          t[q_ + "w2.weight"])
            out += ye * (w * (sel == e)).sum(-1, keepdim=True)
        return out.view(shape)
    return mlp


def main():
    hf_dir, ckpt_model, text_path = sys.argv[1:4]
    val_fraction, batch = float(sys.argv[4]), tuple(int(v) for v in sys.argv[5].split("x"))
    loom_loss = float(sys.argv[6])
    if not loom_loss == loom_loss:
        fail(f"loom's val loss is {loom_loss}")
    with open(os.path.join(hf_dir, "config.json")) as f:
        conf = json.load(f)
    src = read_safetensors(ckpt_model)
    L = conf.get("num_hidden_layers", 0)
    E = conf.get("num_local_experts", 0)
    want = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
            "num_local_experts": 4, "num_experts_per_tok": 2, "hidden_act": "silu",
            "tie_word_embeddings": False, "router_jitter_noise": 0.0,
            "output_router_logits": False, "num_hidden_layers": 2}
    for k, v in want.items():
        if conf.get(k) != v:
            fail(f"config.json {k} = {conf.get(k)!r}, want {v!r}")
    names = hf_names(L, E)
    if set(names) != set(src):
        fail(f"checkpoint names differ from the mapping: {sorted(set(src) ^ set(names))}")
    got = read_safetensors(os.path.join(hf_dir, "model.safetensors"))
    if set(got) != set(names.values()):
        fail(f"names differ: extra {sorted(set(got) - set(names.values()))}, "
             f"missing {sorted(set(names.values()) - set(got))}")
    V, C, FF = conf["vocab_size"], conf["hidden_size"], conf["intermediate_size"]
    for loom_name, hf in names.items():
        a = src[loom_name]
        if hf in ("model.embed_tokens.weight", "lm_head.weight"):
            a = a.rows(V)
        shape = {"block_sparse_moe.gate.weight": (E, C), "w1.weight": (FF, C),
                 "w3.weight": (FF, C), "w2.weight": (C, FF)}
        for suffix, s in shape.items():
            if hf.endswith(suffix) and got[hf].shape != s:
                fail(f"{hf}: shape {got[hf].shape}, want Mixtral's {s}")
        if got[hf].shape != a.shape:
            fail(f"{hf}: shape {got[hf].shape}, want {a.shape}")
        if got[hf].raw != a.raw:
            fail(f"{hf}: values differ from the checkpoint's {loom_name}")
    print(f"ok {len(got)} tensors: Mixtral names and shapes, values bitwise the checkpoint's")
    if np is None:
        print("skipped: Hugging Face's Mixtral forward on the export (needs torch and numpy in "
              f"{sys.executable}; scripts/setup-deps --bench installs them)")
        return
    with open(text_path, "rb") as f:
        text = f.read()
    start = len(text) - int(len(text) * val_fraction)  # data_text.c's val split
    B, T = batch
    ids = torch.tensor(list(text[start:start + B * T + 1]), dtype=torch.int64)
    logits = hf_forward(got, conf, ids[:-1].view(B, T), sparse_moe(conf))  # no sliding window: ctx is small
    loss = F.cross_entropy(logits.view(B * T, -1), ids[1:]).item()
    d = abs(loss - loom_loss)
    if not d < 1e-5:
        fail(f"Hugging Face's Mixtral forward on the export: val loss {loss!r}, loom's {loom_loss!r}")
    print(f"ok Hugging Face's Mixtral forward on the export: val loss {loss:.7f} within {d:.2g} of loom's")

if __name__ == "__main__":
    main()
