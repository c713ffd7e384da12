#!/usr/bin/env python3
"""PyTorch reference training loop for loom's CPU benchmark.

Same GPT-2 as loom (llm.c layout: pre-LN, tanh-GELU, fused QKV [q|k|v], tied LM
head, LN eps 1e-5, vocab padded V->Vp with logits for all Vp columns but the
loss over the first V only), fp32, trained with torch.optim.AdamW on random
token data. Prints exactly one final line of JSON:
  {"impl":"pytorch","tokens_per_s":..,"ms_per_step":..,"steps":..,"params":N,"final_loss":..}

Run with a Python that has PyTorch (here: /usr/bin/python3), e.g.
  /usr/bin/python3 scripts/bench_torch.py --vocab 256 --vocab-padded 256 --ctx 64 \
      --layers 4 --heads 4 --dim 128 --batch 8 --steps 30 --warmup 5 --threads 2
"""
import argparse
import json
import resource
import math
import os
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--vocab-padded", type=int, default=0, help="Vp (default: V)")
    p.add_argument("--ctx", type=int, default=64, help="sequence length T (= maxT)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--verbose", action="store_true", help="per-step times on stderr")
    p.add_argument("--foreach", choices=["auto", "on", "off"], default="auto",
                   help="AdamW multi-tensor (foreach) implementation")
    a = p.parse_args(argv)
    if a.vocab_padded <= 0:
        a.vocab_padded = a.vocab
    if a.vocab_padded < a.vocab:
        p.error("--vocab-padded must be >= --vocab")
    if a.steps < 1 or a.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    if a.dim % a.heads:
        p.error("--dim must be divisible by --heads")
    return a


args = parse_args()


def tune_environment():
    """Process-level settings measured to matter on loom's CPU benchmark machine
    (Debian torch 1.13: GNU OpenMP for intra-op work + pthreads OpenBLAS for GEMMs).
    An explicit setting in the caller's environment always wins.

    GOMP_SPINCOUNT: libgomp workers spin for a long time after each parallel region
    by default; with OpenBLAS's own threads on the same 2 cores that spinning starves
    the GEMMs (F.linear ran at ~16 GFLOP/s instead of ~200, the whole tiny step
    2.5x slower). A short spin keeps back-to-back elementwise ops cheap without
    stealing the BLAS threads' cores. libgomp reads it when torch loads it.

    (Tried and rejected: GLIBC_TUNABLES=glibc.malloc.hugetlb=1 for the ~200 MB
    logits: faster in isolation, but slower and very noisy over a training run.)
    """
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(args.threads))
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")


# Thread pools read these at load time: before importing torch.
tune_environment()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.C, self.NH = C, NH
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = nn.Module()
        self.attn.qkv = nn.Linear(C, 3 * C)
        self.attn.proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = nn.Module()
        self.mlp.fc = nn.Linear(C, 4 * C)
        self.mlp.proj = nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        NH, hs = self.NH, C // self.NH
        qkv = self.attn.qkv(self.ln_1(x))
        # (B, T, 3, NH, hs) -> (3, B, NH, T, hs): q/k/v of head h = cols h*hs.. of each C block
        q, k, v = qkv.view(B, T, 3, NH, hs).permute(2, 0, 3, 1, 4)
        att = torch.baddbmm(mask, q.reshape(B * NH, T, hs),
                            k.reshape(B * NH, T, hs).transpose(1, 2),
                            beta=1.0, alpha=1.0 / math.sqrt(hs))
        att = att.softmax(dim=-1)
        y = torch.bmm(att, v.reshape(B * NH, T, hs))
        y = y.view(B, NH, T, hs).transpose(1, 2).reshape(B, T, C)
        x = x + self.attn.proj(y)
        x = x + self.mlp.proj(F.gelu(self.mlp.fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, V, Vp, maxT, L, NH, C):
        super().__init__()
        self.V, self.Vp, self.maxT = V, Vp, maxT
        self.wte = nn.Parameter(torch.empty(Vp, C))
        self.wpe = nn.Parameter(torch.empty(maxT, C))
        self.h = nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        mask = torch.full((maxT, maxT), float("-inf")).triu(1)
        self.register_buffer("mask", mask, persistent=False)
        # Padded vocab columns: adding -inf as the LM head's bias leaves the first V
        # logits untouched and makes softmax over all Vp columns equal softmax over the
        # first V (padded columns get probability 0, hence zero gradient). Same math as
        # slicing logits[:, :V], but keeps the (B*T, Vp) tensor contiguous: log_softmax
        # on a strided slice, and the zero-filled SliceBackward, were ~25% of a step.
        if Vp != V:
            pad = torch.zeros(Vp)
            pad[V:] = float("-inf")
            self.register_buffer("vocab_pad", pad, persistent=False)
        else:
            self.vocab_pad = None
        std_proj = 0.02 / math.sqrt(2 * L)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, std_proj if name.endswith("proj.weight") else 0.02)
            elif "ln_" in name and name.endswith("weight"):
                nn.init.ones_(p)
            else:
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = F.embedding(idx, self.wte) + self.wpe[:T]
        mask = self.mask[:T, :T]
        for blk in self.h:
            x = blk(x, mask)
        # (B*T, Vp) logits for all padded columns: x @ wte^T (+ -inf past V)
        logits = F.linear(self.ln_f(x).view(B * T, -1), self.wte, self.vocab_pad)
        return F.cross_entropy(logits, targets.reshape(-1))


def main():
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.autograd.set_detect_anomaly(False)
    torch.backends.mkldnn.enabled = True
    torch.manual_seed(args.seed)

    V, Vp, T, B = args.vocab, args.vocab_padded, args.ctx, args.batch
    model = GPT(V, Vp, T, args.layers, args.heads, args.dim)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())

    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    # foreach (multi-tensor) AdamW measured ~15% slower than the per-tensor loop on
    # CPU in torch 1.13 (small config: 127 vs 107 ms/step; tiny: 2.5 vs 2.3 ms);
    # 1.13 has no CPU fused AdamW. "auto" = the loop (also 1.13's CPU default).
    kw = {"foreach": args.foreach == "on"}
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **kw)

    gen = torch.Generator().manual_seed(args.seed + 1)
    total = args.warmup + args.steps
    data = torch.randint(0, V, (total, B, T + 1), generator=gen)

    loss_val = float("nan")
    t0 = None
    t_prev = time.perf_counter()
    for step in range(total):
        if step == args.warmup:
            t0 = time.perf_counter()
            c0 = time.process_time()
        x, y = data[step, :, :T], data[step, :, 1:]
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        opt.step()
        loss_val = loss.item()  # syncs; same cost in every step
        if args.verbose:
            now = time.perf_counter()
            print(f"step {step}: loss {loss_val:.4f} {1000 * (now - t_prev):.1f} ms",
                  file=sys.stderr)
            t_prev = now
    dt = time.perf_counter() - t0
    cpu_ms = 1000.0 * (time.process_time() - c0) / args.steps
    ms = 1000.0 * dt / args.steps
    res = {
        "impl": "pytorch",
        "tokens_per_s": round(B * T * args.steps / dt, 1),
        "ms_per_step": round(ms, 3),
        # CPU time of all this process's threads per timed step (spin-waits included)
        "cpu_ms_per_step": round(cpu_ms, 3),
        "steps": args.steps,
        "params": n_params,
        "final_loss": round(loss_val, 6),
        # this process's peak resident set, bytes (Linux reports ru_maxrss in KiB)
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    print(json.dumps(res))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
