#!/usr/bin/env python3
"""PyTorch reference training loop for loom's llama benchmark (scripts/bench-llama).

The same model as loom.llama (core/model/gpt_llama.c, Hugging Face LlamaForCausalLM's
math) in plain torch: pre-norm RMSNorm, rotary embeddings in HF's rotate_half layout
(cos/sin cached per position), grouped-query attention (kv head h // (heads/kv_heads)
serves q head h; repeat_kv as HF does), a SwiGLU MLP, no biases; q|k|v and gate|up as
one product each, as loom runs them; the LM head untied unless --tie-embeddings. fp32,
torch.optim.AdamW, random tokens; the loop, the thread settings and the padded-vocab
trick are scripts/bench_torch.py's (its comments say why). Debian's torch 1.13 has no
F.scaled_dot_product_attention: attention is baddbmm + softmax + bmm as there.
Prints one final line of JSON:
  {"impl":"pytorch-llama","tokens_per_s":..,"ms_per_step":..,"steps":..,"params":N,...,
   "cpu_ms_per_step":.. (this process's CPU time, all threads, per timed step)}

  /usr/bin/python3 scripts/bench_llama_torch.py --vocab 256 --ctx 64 --layers 4 --heads 4 \
      --kv-heads 2 --dim 128 --ffn-dim 384 --tie-embeddings --batch 8 --steps 30 --threads 2
"""
import argparse
import json
import math
import os
import resource
import time

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--vocab", type=int, default=256)
p.add_argument("--vocab-padded", type=int, default=0, help="Vp (default: V)")
p.add_argument("--ctx", type=int, default=64)
p.add_argument("--layers", type=int, default=4)
p.add_argument("--heads", type=int, default=4)
p.add_argument("--kv-heads", type=int, default=0, help="default: heads")
p.add_argument("--dim", type=int, default=128)
p.add_argument("--ffn-dim", type=int, default=0, help="default: 4 x dim")
p.add_argument("--rope-theta", type=float, default=10000.0)
p.add_argument("--norm-eps", type=float, default=1e-5)
p.add_argument("--tie-embeddings", action="store_true")
p.add_argument("--batch", type=int, default=8)
p.add_argument("--steps", type=int, default=20, help="timed steps")
p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
p.add_argument("--lr", type=float, default=3e-4)
p.add_argument("--seed", type=int, default=1337)
args = p.parse_args()
args.vocab_padded = args.vocab_padded or args.vocab
args.kv_heads = args.kv_heads or args.heads
args.ffn_dim = args.ffn_dim or 4 * args.dim
if args.vocab_padded < args.vocab or args.heads % args.kv_heads or args.dim % args.heads or \
        (args.dim // args.heads) % 2 or args.steps < 1:
    p.error("need vocab-padded >= vocab, kv-heads | heads, heads | dim, an even head size, "
            "steps >= 1")

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, str(args.threads))
os.environ.setdefault("GOMP_SPINCOUNT", "10000")  # before torch loads libgomp

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(C))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Block(nn.Module):
    def __init__(self, C, NH, KVH, Fd, eps):
        super().__init__()
        self.NH, self.KVH, self.hs, self.Fd = NH, KVH, C // NH, Fd
        self.ln_1, self.ln_2 = RMSNorm(C, eps), RMSNorm(C, eps)
        self.qkv = nn.Linear(C, C + 2 * KVH * self.hs, bias=False)
        self.o = nn.Linear(C, C, bias=False)
        self.gate_up = nn.Linear(C, 2 * Fd, bias=False)
        self.down = nn.Linear(Fd, C, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, C = x.shape
        NH, KVH, hs = self.NH, self.KVH, self.hs
        q, k, v = self.qkv(self.ln_1(x)).split([C, KVH * hs, KVH * hs], dim=-1)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, KVH, hs).transpose(1, 2)
        v = v.view(B, T, KVH, hs).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if KVH != NH:  # HF's repeat_kv
            k = k.repeat_interleave(NH // KVH, dim=1)
            v = v.repeat_interleave(NH // KVH, dim=1)
        att = torch.baddbmm(mask, q.reshape(B * NH, T, hs),
                            k.reshape(B * NH, T, hs).transpose(1, 2),
                            beta=1.0, alpha=1.0 / math.sqrt(hs)).softmax(dim=-1)
        y = torch.bmm(att, v.reshape(B * NH, T, hs))
        x = x + self.o(y.view(B, NH, T, hs).transpose(1, 2).reshape(B, T, C))
        g, u = self.gate_up(self.ln_2(x)).split([self.Fd, self.Fd], dim=-1)
        return x + self.down(F.silu(g) * u)


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        C, hs = a.dim, a.dim // a.heads
        self.wte = nn.Parameter(torch.empty(a.vocab_padded, C))
        self.head = self.wte if a.tie_embeddings else nn.Parameter(torch.empty(a.vocab_padded, C))
        self.h = nn.ModuleList([Block(C, a.heads, a.kv_heads, a.ffn_dim, a.norm_eps)
                                for _ in range(a.layers)])
        self.ln_f = RMSNorm(C, a.norm_eps)
        inv = a.rope_theta ** (-torch.arange(0, hs // 2, dtype=torch.float64) / (hs // 2))
        ang = torch.arange(a.ctx, dtype=torch.float64)[:, None] * inv[None, :]
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)
        self.register_buffer("mask", torch.full((a.ctx, a.ctx), float("-inf")).triu(1),
                             persistent=False)
        pad = torch.zeros(a.vocab_padded)
        pad[a.vocab:] = float("-inf")
        self.register_buffer("vocab_pad", pad if a.vocab_padded != a.vocab else None,
                             persistent=False)
        std_proj = 0.02 / math.sqrt(2 * a.layers)
        for name, prm in self.named_parameters():
            if prm.dim() == 2:
                nn.init.normal_(prm, 0.0, std_proj if name.endswith(("o.weight", "down.weight"))
                                else 0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = F.embedding(idx, self.wte)
        cos, sin, mask = self.cos[:T], self.sin[:T], self.mask[:T, :T]
        for blk in self.h:
            x = blk(x, cos, sin, mask)
        logits = F.linear(self.ln_f(x).view(B * T, -1), self.head, self.vocab_pad)
        return F.cross_entropy(logits, targets.reshape(-1))


def main():
    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(args.seed)
    V, T, B = args.vocab, args.ctx, args.batch
    model = Llama(args)
    model.train()
    # counted as loom counts them: without the vocabulary's padding rows (wte, the head)
    n_params = sum(prm.numel() for prm in model.parameters()) - \
        (args.vocab_padded - V) * args.dim * (1 if args.tie_embeddings else 2)
    decay = [prm for prm in model.parameters() if prm.dim() == 2]
    no_decay = [prm for prm in model.parameters() if prm.dim() != 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    gen = torch.Generator().manual_seed(args.seed + 1)
    total = args.warmup + args.steps
    data = torch.randint(0, V, (total, B, T + 1), generator=gen)
    loss_val, t0, c0 = float("nan"), None, None
    for step in range(total):
        if step == args.warmup:
            t0, c0 = time.perf_counter(), time.process_time()
        x, y = data[step, :, :T], data[step, :, 1:]
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        opt.step()
        loss_val = loss.item()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({
        "impl": "pytorch-llama", "tokens_per_s": round(B * T * args.steps / dt, 1),
        "ms_per_step": round(1000.0 * dt / args.steps, 3), "steps": args.steps,
        "params": n_params, "final_loss": round(loss_val, 6),
        "cpu_ms_per_step": round(1000.0 * cpu / args.steps, 3),
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}), flush=True)


if __name__ == "__main__":
    main()
