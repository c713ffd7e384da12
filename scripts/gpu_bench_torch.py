#!/usr/bin/env python3
"""gpu_bench_torch.py -- the PyTorch side of scripts/gpu-check's benchmark: GPT-2 124M
(V 50257 padded to 50304, T 1024, 12 layers, 12 heads, C 768, tied embedding, GELU tanh),
the same model loom's bench_cuda_gpt runs, on the same GPU, eager and torch.compile.

Configurations, one JSON line each (tokens/s, ms per step, MFU = tokens/s * (6N + 6LCT) /
peak, N without the padding rows; peaks 989 TFLOP/s dense bf16, 67 fp32):
  fp32 fwd+bwd           -- what loom's fp32 benchmark measures (TF32 off, as loom's GEMMs)
  bf16 autocast fwd+bwd+AdamW (fused) -- the issue's benchmark configuration
each eager and compiled. Usage: gpu_bench_torch.py [B [steps]] (defaults 8, 10);
GPU_BENCH_DTYPES=bf16 (or fp32, or both, comma-separated: the order run) picks them.
  gpu_bench_torch.py --configs tiny,small [steps]: instead, scripts/bench-cpu's tiny and
  small shapes (the ones loom's scripts/recipes/bench_gpt.lua runs with backend=cuda),
  fp32 fwd+bwd+AdamW (TF32 off, PyTorch's default CUDA AdamW), eager and compiled.
"""
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

V, VP, T, L, H, C = 50257, 50304, 1024, 12, 12, 768
# scripts/bench-cpu's shapes: V, Vp, T, L, H, C, B (set as the globals above for a run)
CONFIGS = {"tiny": (256, 256, 64, 4, 4, 128, 8), "small": (50257, 50304, 256, 6, 6, 384, 4)}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, Tn, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, Tn, H, C // H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, Tn, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VP, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.lnf = nn.LayerNorm(C)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()
        logits = logits[..., :V]  # padding columns are never predicted
        return F.cross_entropy(logits.float().reshape(-1, V), targets.reshape(-1))


def run(B, steps, dtype, compiled, optimizer, fused=True):
    torch.manual_seed(0)
    model = GPT().cuda()
    n_params = sum(p.numel() for p in model.parameters()) - (VP - V) * C
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=fused) if optimizer else None
    fwd = torch.compile(model) if compiled else model
    idx = torch.randint(0, V, (B, T), device="cuda")
    tgt = torch.randint(0, V, (B, T), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = fwd(idx, tgt)
        loss.backward()
        if opt:
            opt.step()
        model.zero_grad(set_to_none=True)
        return loss

    t_first = time.time()
    for _ in range(3):
        loss = step()
    torch.cuda.synchronize()
    warm_s = time.time() - t_first
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        loss = step()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / steps
    tps = B * T / (ms / 1e3)
    flops_tok = 6 * n_params + 6 * L * C * T
    return {"impl": "pytorch " + ("compile" if compiled else "eager"),
            "what": f"{'fwd+bwd+AdamW' if optimizer else 'fwd+bwd'} {dtype}",
            "torch": torch.__version__, "B": B, "T": T, "params": n_params,
            "ms_per_step": round(ms, 3), "tokens_per_s": round(tps, 1),
            "tflops": round(tps * flops_tok / 1e12, 2),
            "mfu_bf16_peak": round(tps * flops_tok / 989e12, 4),
            "mfu_fp32_peak": round(tps * flops_tok / 67e12, 4),
            "warmup_s": round(warm_s, 1), "loss": round(float(loss), 4)}


def main_configs(names, steps):
    global V, VP, T, L, H, C
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for name in names:
        V, VP, T, L, H, C, B = CONFIGS[name]
        for compiled in (False, True):
            try:
                r = run(B, steps, "fp32", compiled, True, fused=None)
            except Exception as e:
                r = {"impl": "pytorch " + ("compile" if compiled else "eager"),
                     "what": "fwd+bwd+AdamW fp32", "error": repr(e)[:300]}
            r["config"] = name
            print(json.dumps(r), flush=True)
            torch.cuda.empty_cache()


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--configs":
        return main_configs(sys.argv[2].split(","), int(sys.argv[3]) if len(sys.argv) > 3 else 10)
    B = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32, as loom's GEMMs
    torch.backends.cudnn.allow_tf32 = False
    # GPU_BENCH_DTYPES (default fp32,bf16): which configurations, in that order
    wanted = os.environ.get("GPU_BENCH_DTYPES", "fp32,bf16").split(",")
    for dtype, optimizer in [(d, d == "bf16") for d in wanted if d in ("fp32", "bf16")]:
        for compiled in (False, True):
            try:
                r = run(B, steps, dtype, compiled, optimizer)
            except Exception as e:  # one configuration failing must not hide the others
                r = {"impl": "pytorch " + ("compile" if compiled else "eager"),
                     "what": f"{dtype} optimizer={optimizer}", "error": repr(e)[:300]}
            print(json.dumps(r), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
