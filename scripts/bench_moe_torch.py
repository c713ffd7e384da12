#!/usr/bin/env python3
"""PyTorch mixture-of-experts GPT for loom's MoE benchmark (scripts/bench-moe).

bench_torch.py's GPT-2 and training loop with every MLP replaced by loom's MoE layer
(docs/MOE.md): a bias-free linear router, softmax probabilities, the top k experts by
logit, gates renormalised over the chosen (k > 1) or the raw probability (k = 1), capacity
ceil(k R / E c) per expert filled choice-rank major (overflow dropped), each expert one
fc-GELU-proj over the rows it received (index_select, two Linear, index_add: a grouped
computation, not one per token), plus the Switch aux loss alpha E sum f P and the z-loss
beta mean lse^2 added to the cross-entropy. Prints bench_torch.py's JSON line.

  /usr/bin/python3 scripts/bench_moe_torch.py --experts 8 --top-k 2 --capacity-factor 1.25 \
      --vocab 256 --ctx 64 --layers 4 --heads 4 --dim 128 --batch 8 --steps 30 --threads 2
"""
import argparse
import math
import os
import sys

moe = argparse.ArgumentParser(add_help=False)
moe.add_argument("--experts", type=int, default=8)
moe.add_argument("--top-k", type=int, default=2)
moe.add_argument("--capacity-factor", type=float, default=1.25, help="0: dropless")
moe.add_argument("--aux-loss", type=float, default=0.01)
moe.add_argument("--z-loss", type=float, default=0.001)
margs, rest = moe.parse_known_args()
if not 1 <= margs.top_k <= margs.experts:
    moe.error("--top-k must be 1 to --experts")
sys.argv = [sys.argv[0]] + rest  # bench_torch parses the shared arguments on import
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_torch as bt  # noqa: E402  (sets the thread environment, imports torch)

torch, nn, F = bt.torch, bt.nn, bt.F
aux_terms = []  # this forward's aux + z losses, one per block


class MoE(nn.Module):
    def __init__(self, C, E, k, c):
        super().__init__()
        self.E, self.k, self.c = E, k, c
        self.router = nn.Linear(C, E, bias=False)
        self.experts = nn.ModuleList()
        for _ in range(E):
            e = nn.Module()
            e.fc = nn.Linear(C, 4 * C)
            e.proj = nn.Linear(4 * C, C)
            self.experts.append(e)

    def forward(self, x):
        B, T, C = x.shape
        R, E, k = B * T, self.E, self.k
        x = x.reshape(R, C)
        logits = self.router(x)
        probs = logits.softmax(-1)
        top_l, top_i = logits.topk(k, dim=-1)
        gates = top_l.softmax(-1) if k > 1 else probs.gather(1, top_i)
        # choice-rank major: every token's first choice, then every second choice
        choice_e = top_i.t().reshape(-1)
        onehot = F.one_hot(choice_e, E)
        slot = (onehot.cumsum(0) * onehot).sum(1) - 1
        keep = torch.ones_like(slot, dtype=torch.bool)
        if self.c > 0:
            keep = slot < math.ceil(k * R / E * self.c)
        tok = torch.arange(R).repeat(k)[keep]
        exp = choice_e[keep]
        gate = gates.t().reshape(-1)[keep]
        order = torch.argsort(exp, stable=True)
        tok, exp, gate = tok[order], exp[order], gate[order]
        counts = torch.bincount(exp, minlength=E).tolist()
        out = torch.zeros_like(x)
        at = 0
        for e, n in enumerate(counts):
            if n:
                rows = tok[at:at + n]
                mlp = self.experts[e]
                y = mlp.proj(F.gelu(mlp.fc(x.index_select(0, rows)), approximate="tanh"))
                out = out.index_add(0, rows, y * gate[at:at + n, None])
            at += n
        f = onehot.float().mean(0)
        aux_terms.append(margs.aux_loss * E * (f * probs.mean(0)).sum() +
                         margs.z_loss * torch.logsumexp(logits, -1).pow(2).mean())
        return out.view(B, T, C)


class MoEBlock(bt.Block):
    def __init__(self, C, NH):
        super().__init__(C, NH)
        del self.mlp
        self.moe = MoE(C, margs.experts, margs.top_k, margs.capacity_factor)

    def forward(self, x, mask):
        B, T, C = x.shape
        NH, hs = self.NH, C // self.NH
        qkv = self.attn.qkv(self.ln_1(x))
        q, k, v = qkv.view(B, T, 3, NH, hs).permute(2, 0, 3, 1, 4)
        att = torch.baddbmm(mask, q.reshape(B * NH, T, hs),
                            k.reshape(B * NH, T, hs).transpose(1, 2),
                            beta=1.0, alpha=1.0 / math.sqrt(hs))
        y = torch.bmm(att.softmax(dim=-1), v.reshape(B * NH, T, hs))
        y = y.view(B, NH, T, hs).transpose(1, 2).reshape(B, T, C)
        x = x + self.attn.proj(y)
        return x + self.moe(self.ln_2(x))


class MoEGPT(bt.GPT):
    def forward(self, idx, targets):
        aux_terms.clear()
        ce = super().forward(idx, targets)
        return ce + sum(aux_terms)


bt.Block = MoEBlock  # GPT builds its blocks from the module's Block
bt.GPT = MoEGPT
if __name__ == "__main__":
    bt.main()
