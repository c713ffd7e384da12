#!/usr/bin/env python3
"""PyTorch Megatron-style tensor-parallel training loop, the peer of loom's mesh.tp benchmark.

The GPT of scripts/bench_torch.py (llm.c layout: pre-LN, tanh-GELU, fused QKV [q|k|v], tied
LM head, LN eps 1e-5, padded vocab Vp with the loss over the first V), fp32, AdamW, random
tokens, split over --tp ranks the way Megatron-LM does it (megatron/core/tensor_parallel),
written out in plain PyTorch because Megatron-LM itself needs CUDA:

  * f = copy_to_tensor_model_parallel_region: identity forward, all-reduce backward;
    g = reduce_from_tensor_model_parallel_region: all-reduce forward, identity backward
    (autograd Functions below).
  * ColumnParallelLinear (f, then the rank's output columns): fused QKV (this rank's heads of
    q, k and v) and MLP fc. RowParallelLinear (the rank's input columns, then g, then the
    replicated bias): attention proj and MLP proj. Attention runs on the rank's heads.
  * VocabParallelEmbedding: the rank's Vp/tp rows of wte; ids outside them are masked, then g.
    The tied LM head is f, then x @ wte_rank^T: (B*T, Vp/tp) logits, and Megatron's
    vocab-parallel cross-entropy (max, target logit and sum-of-exp all-reduced).
  * wpe and the layernorms are replicated (their gradients come out equal on every rank).

tp=1 is the same modules with no exchanges and the plain F.embedding / F.cross_entropy path:
the single-process model a user would train. Every rank builds each full parameter from one
seeded generator (same order for every tp) and keeps its slice, as Megatron's CPU
initialisation does, so tp=2's losses equal tp=1's up to fp32 summation order.

Ranks are processes started with torch.multiprocessing (spawn) and joined over
torch.distributed's gloo backend (a FileStore: no network needed). Threads: --threads per
rank (the benchmark gives 2 at tp=1 and 1 each at tp=2 on a 2-core machine).

Prints exactly one final line of JSON:
  {"impl":"pytorch-tp","tp":2,"tokens_per_s":..,"ms_per_step":..,"comm_ms":..,"comm_share":..,
   "steps":..,"params":N,"param_bytes":[per rank],"peak_rss":[per rank],"losses":[..],
   "final_loss":..}
comm_ms is the mean per timed step of wall time inside all-reduces on rank 0 (waiting for the
slower rank included, as with loom's comm_ms); comm_share = comm_ms / ms_per_step.

  /usr/bin/python3 scripts/bench_tp_torch.py --tp 2 --threads 1 --vocab 256 --ctx 64 \
      --layers 4 --heads 4 --dim 128 --batch 8 --steps 30 --warmup 2
"""
import argparse
import json
import math
import os
import resource
import sys
import tempfile
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel ranks (processes)")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--vocab-padded", type=int, default=0, help="Vp (default: V)")
    p.add_argument("--ctx", type=int, default=64, help="sequence length T (= maxT)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--threads", type=int, default=1, help="threads per rank")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--verbose", action="store_true", help="per-step times on stderr")
    a = p.parse_args(argv)
    if a.vocab_padded <= 0:
        a.vocab_padded = a.vocab
    if a.vocab_padded < a.vocab:
        p.error("--vocab-padded must be >= --vocab")
    if a.steps < 1 or a.warmup < 0 or a.tp < 1:
        p.error("--steps and --tp must be >= 1, --warmup >= 0")
    for what, n in (("--heads", a.heads), ("4 x --dim", 4 * a.dim), ("--vocab-padded", a.vocab_padded)):
        if n % a.tp:
            p.error(f"--tp {a.tp} does not divide {what} = {n}")
    if a.dim % a.heads:
        p.error("--dim must be divisible by --heads")
    if a.tp > 1 and a.vocab_padded // a.tp * (a.tp - 1) >= a.vocab:
        p.error("the last rank's vocabulary rows would all be padding")
    return a


args = parse_args()
# Same process settings as scripts/bench_torch.py (see its tune_environment): thread pools
# read these when torch loads, and spawned ranks inherit them.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, str(args.threads))
os.environ.setdefault("GOMP_SPINCOUNT", "10000")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

TP, RANK = 1, 0
COMM_S = 0.0  # seconds inside all-reduces since the last reset


def all_reduce(t, op=None):
    global COMM_S
    t0 = time.perf_counter()
    dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    COMM_S += time.perf_counter() - t0
    return t


class CopyToRegion(torch.autograd.Function):  # Megatron's f
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        return all_reduce(g.contiguous())


class ReduceFromRegion(torch.autograd.Function):  # Megatron's g
    @staticmethod
    def forward(ctx, x):
        return all_reduce(x.contiguous())

    @staticmethod
    def backward(ctx, g):
        return g


def copy_to(x):
    return CopyToRegion.apply(x) if TP > 1 else x


def reduce_from(x):
    return ReduceFromRegion.apply(x) if TP > 1 else x


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Megatron's _VocabParallelCrossEntropy: per-row loss from (N, Vp/tp) logits."""

    @staticmethod
    def forward(ctx, logits, target, start, end):
        logits_max = logits.max(dim=-1)[0]
        all_reduce(logits_max, dist.ReduceOp.MAX)
        logits = logits - logits_max.unsqueeze(-1)
        outside = (target < start) | (target >= end)
        local = (target - start).masked_fill(outside, 0)
        rows = torch.arange(logits.shape[0])
        predicted = logits[rows, local].masked_fill(outside, 0.0)
        all_reduce(predicted)
        exp = logits.exp_()
        sum_exp = exp.sum(dim=-1)
        all_reduce(sum_exp)
        loss = torch.log(sum_exp) - predicted
        exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(exp, outside, local)
        return loss

    @staticmethod
    def backward(ctx, g):
        softmax, outside, local = ctx.saved_tensors
        grad = softmax
        rows = torch.arange(grad.shape[0])
        grad[rows, local] -= 1.0 - outside.float()
        grad.mul_(g.unsqueeze(-1))
        return grad, None, None, None


class Init:
    """One generator, one full tensor at a time in a fixed order; the caller keeps its slice."""

    def __init__(self, seed, L):
        self.gen = torch.Generator().manual_seed(seed)
        self.std_proj = 0.02 / math.sqrt(2 * L)

    def normal(self, *shape, std=0.02):
        return torch.empty(*shape).normal_(0.0, std, generator=self.gen)


def rows(t, parts):  # this rank's slice along dim 0
    n = t.shape[0] // parts
    return t[RANK * n:(RANK + 1) * n].clone()


def cols(t, parts):  # along dim 1
    n = t.shape[1] // parts
    return t[:, RANK * n:(RANK + 1) * n].clone()


class Block(nn.Module):
    def __init__(self, C, NH, init):
        super().__init__()
        self.NH, self.hs = NH // TP, C // NH
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        # ColumnParallel QKV: this rank's heads of q, k and v, stacked [q_r | k_r | v_r]
        qkv = init.normal(3 * C, C)
        self.qkv_w = nn.Parameter(torch.cat([rows(w, TP) for w in qkv.chunk(3)]))
        self.qkv_b = nn.Parameter(torch.zeros(3 * C // TP))
        # RowParallel proj: this rank's input columns; the bias is added once, after g
        self.proj_w = nn.Parameter(cols(init.normal(C, C, std=init.std_proj), TP))
        self.proj_b = nn.Parameter(torch.zeros(C))
        self.fc_w = nn.Parameter(rows(init.normal(4 * C, C), TP))
        self.fc_b = nn.Parameter(torch.zeros(4 * C // TP))
        self.mproj_w = nn.Parameter(cols(init.normal(C, 4 * C, std=init.std_proj), TP))
        self.mproj_b = nn.Parameter(torch.zeros(C))

    def forward(self, x, mask):
        B, T, _ = x.shape
        NH, hs = self.NH, self.hs
        qkv = F.linear(copy_to(self.ln_1(x)), self.qkv_w, self.qkv_b)
        q, k, v = qkv.view(B, T, 3, NH, hs).permute(2, 0, 3, 1, 4)
        att = torch.baddbmm(mask, q.reshape(B * NH, T, hs),
                            k.reshape(B * NH, T, hs).transpose(1, 2),
                            beta=1.0, alpha=1.0 / math.sqrt(hs))
        y = torch.bmm(att.softmax(dim=-1), v.reshape(B * NH, T, hs))
        y = y.view(B, NH, T, hs).transpose(1, 2).reshape(B, T, NH * hs)
        x = x + reduce_from(F.linear(y, self.proj_w)) + self.proj_b
        h = F.gelu(F.linear(copy_to(self.ln_2(x)), self.fc_w, self.fc_b), approximate="tanh")
        return x + reduce_from(F.linear(h, self.mproj_w)) + self.mproj_b


class GPT(nn.Module):
    def __init__(self, V, Vp, maxT, L, NH, C, seed):
        super().__init__()
        self.V, self.Vp = V, Vp
        self.v0, self.v1 = RANK * Vp // TP, (RANK + 1) * Vp // TP
        init = Init(seed, L)
        self.wte = nn.Parameter(rows(init.normal(Vp, C), TP))  # VocabParallelEmbedding
        self.wpe = nn.Parameter(init.normal(maxT, C))
        self.h = nn.ModuleList([Block(C, NH, init) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        self.register_buffer("mask", torch.full((maxT, maxT), float("-inf")).triu(1),
                             persistent=False)
        # padded vocab columns get -inf as LM-head bias (see bench_torch.py); this rank's part
        pad = torch.zeros(Vp)
        pad[V:] = float("-inf")
        self.vocab_pad = rows(pad, TP) if Vp != V else None

    def forward(self, idx, targets):
        B, T = idx.shape
        if TP > 1:
            outside = (idx < self.v0) | (idx >= self.v1)
            e = F.embedding((idx - self.v0).masked_fill(outside, 0), self.wte)
            x = reduce_from(e.masked_fill(outside.unsqueeze(-1), 0.0))
        else:
            x = F.embedding(idx, self.wte)
        x = x + self.wpe[:T]
        mask = self.mask[:T, :T]
        for blk in self.h:
            x = blk(x, mask)
        logits = F.linear(copy_to(self.ln_f(x).view(B * T, -1)), self.wte, self.vocab_pad)
        if TP > 1:
            return VocabParallelCrossEntropy.apply(logits, targets.reshape(-1),
                                                   self.v0, self.v1).mean()
        return F.cross_entropy(logits, targets.reshape(-1))


def peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run(rank, a, store_path):
    global TP, RANK, COMM_S
    TP, RANK = a.tp, rank
    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    if TP > 1:
        dist.init_process_group("gloo", init_method="file://" + store_path, rank=rank,
                                world_size=TP)
    V, Vp, T, B = a.vocab, a.vocab_padded, a.ctx, a.batch
    model = GPT(V, Vp, T, a.layers, a.heads, a.dim, a.seed)
    model.train()
    local = sum(p.numel() for p in model.parameters())
    # whole-model count: replicated tensors once, split ones x tp
    replicated = sum(p.numel() for n, p in model.named_parameters()
                     if n.startswith(("wpe", "ln_f")) or ".ln_" in n
                     or n.endswith(("proj_b", "mproj_b")))
    n_params = replicated + (local - replicated) * TP
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=a.lr, betas=(0.9, 0.95), eps=1e-8, foreach=False)

    gen = torch.Generator().manual_seed(a.seed + 1)
    total = a.warmup + a.steps
    data = torch.randint(0, V, (total, B, T + 1), generator=gen)

    losses, t0, comm = [], None, 0.0
    t_prev = time.perf_counter()
    for step in range(total):
        if step == a.warmup:
            if TP > 1:
                dist.barrier()
            t0, COMM_S = time.perf_counter(), 0.0
        x, y = data[step, :, :T], data[step, :, 1:]
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if a.verbose and rank == 0:
            now = time.perf_counter()
            print(f"step {step}: loss {losses[-1]:.6f} {1000 * (now - t_prev):.1f} ms "
                  f"comm {1000 * COMM_S:.1f} ms", file=sys.stderr)
            t_prev = now
    dt = time.perf_counter() - t0
    comm = COMM_S
    ms = 1000.0 * dt / a.steps
    mine = {"param_bytes": 4 * local, "peak_rss": peak_rss()}
    ranks = [mine]
    if TP > 1:
        ranks = [None] * TP
        dist.all_gather_object(ranks, mine)
        dist.destroy_process_group()
    if rank == 0:
        res = {
            "impl": "pytorch-tp",
            "tp": TP,
            "tokens_per_s": round(B * T * a.steps / dt, 1),
            "ms_per_step": round(ms, 3),
            "comm_ms": round(1000.0 * comm / a.steps, 3),
            "comm_share": round(comm / dt, 4),
            "steps": a.steps,
            "params": n_params,
            "param_bytes": [r["param_bytes"] for r in ranks],
            "peak_rss": [r["peak_rss"] for r in ranks],
            "losses": [round(v, 6) for v in losses[:3]],
            "final_loss": round(losses[-1], 6),
        }
        print(json.dumps(res))
        sys.stdout.flush()


def main():
    if args.tp == 1:
        run(0, args, "")
        return
    fd, store = tempfile.mkstemp(prefix="bench_tp_torch.")
    os.close(fd)
    os.unlink(store)  # the FileStore creates it; a stale file would hang the rendezvous
    try:
        mp.spawn(run, args=(args, store), nprocs=args.tp, join=True)
    finally:
        if os.path.exists(store):
            os.unlink(store)


if __name__ == "__main__":
    main()
