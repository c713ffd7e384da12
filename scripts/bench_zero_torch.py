#!/usr/bin/env python3
"""PyTorch ZeRO stage 1 over data parallelism, the peer of loom's strategy.zero = 1 benchmark.

bench_torch.py's GPT-2 (imported, not copied) trained by --dp processes (torch.multiprocessing
spawn, gloo over a FileStore: no network) under DistributedDataParallel, with the optimizer
torch.distributed.optim.ZeroRedundancyOptimizer wrapping torch.optim.AdamW (the same betas,
eps and decay groups as bench_torch.py): each rank keeps the AdamW state of its share of the
parameters, steps it, and the updated parameters are broadcast (ZeRO stage 1). --no-zero runs
plain AdamW under DDP instead (every rank holds all the state). Each rank trains on its own
--batch sequences a step (the global batch is dp x batch), fp32, random tokens.

Prints exactly one final line of JSON:
  {"impl":"pytorch-zero1","dp":2,"tokens_per_s":..,"ms_per_step":..,"steps":..,"params":N,
   "optimizer_bytes":[per rank],"peak_rss":[per rank],"losses":[..],"final_loss":..}
tokens_per_s counts all ranks' tokens over rank 0's wall time of the timed steps;
optimizer_bytes is the AdamW state (exp_avg, exp_avg_sq) each rank holds.

  /usr/bin/python3 scripts/bench_zero_torch.py --dp 2 --threads 1 --vocab 256 --ctx 64 \
      --layers 4 --heads 4 --dim 128 --batch 8 --steps 20 --warmup 2
"""
import argparse
import json
import os
import resource
import sys
import tempfile
import time

zero = argparse.ArgumentParser(add_help=False)
zero.add_argument("--dp", type=int, default=2, help="data-parallel ranks (processes)")
zero.add_argument("--no-zero", action="store_true", help="plain AdamW under DDP")
zargs, rest = zero.parse_known_args()
if zargs.dp < 1:
    zero.error("--dp must be >= 1")
sys.argv = [sys.argv[0]] + rest  # bench_torch parses the shared arguments on import
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_torch as bt  # noqa: E402  (sets the thread environment, imports torch)

torch = bt.torch
args = bt.args


def rank_main(rank, store_path, out_path, dp, no_zero):
    # (spawned ranks re-import this file with the argv left for bench_torch: the ZeRO
    # options come as arguments)
    zargs.dp, zargs.no_zero = dp, no_zero
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(args.threads)
    store = dist.FileStore(store_path, zargs.dp)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=zargs.dp)
    torch.manual_seed(args.seed)  # every rank draws the same initial model
    V, Vp, T, B = args.vocab, args.vocab_padded, args.ctx, args.batch
    model = bt.GPT(V, Vp, T, args.layers, args.heads, args.dim)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    ddp = DDP(model)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    kw = dict(lr=args.lr, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    if zargs.no_zero:
        opt = torch.optim.AdamW(groups, **kw)
    else:
        opt = ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, **kw)
    gen = torch.Generator().manual_seed(args.seed + 1)
    total = args.warmup + args.steps
    data = torch.randint(0, V, (total, zargs.dp * B, T + 1), generator=gen)
    losses = []
    for step in range(total):
        if step == args.warmup:
            dist.barrier()
            t0 = time.perf_counter()
        x = data[step, rank * B:(rank + 1) * B, :T]
        y = data[step, rank * B:(rank + 1) * B, 1:]
        opt.zero_grad(set_to_none=True)
        loss = ddp(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    dt = time.perf_counter() - t0
    state = opt.optim.state if not zargs.no_zero else opt.state
    opt_bytes = sum(t.numel() * t.element_size() for s in state.values() for t in s.values()
                    if torch.is_tensor(t) and t.dim() > 0)
    res = {"rank": rank, "dt": dt, "params": n_params, "optimizer_bytes": opt_bytes,
           "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "losses": losses}
    with open(f"{out_path}.{rank}", "w") as f:
        json.dump(res, f)
    dist.destroy_process_group()


def main():
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank")
        mp.spawn(rank_main, args=(os.path.join(tmp, "store"), out, zargs.dp, zargs.no_zero),
                 nprocs=zargs.dp, join=True)
        ranks = []
        for r in range(zargs.dp):
            with open(f"{out}.{r}") as f:
                ranks.append(json.load(f))
    dt = ranks[0]["dt"]
    tokens = zargs.dp * args.batch * args.ctx * args.steps
    res = {
        "impl": "pytorch-ddp" if zargs.no_zero else "pytorch-zero1",
        "dp": zargs.dp,
        "tokens_per_s": round(tokens / dt, 1),
        "ms_per_step": round(1000.0 * dt / args.steps, 3),
        "steps": args.steps,
        "params": ranks[0]["params"],
        "optimizer_bytes": [r["optimizer_bytes"] for r in ranks],
        "peak_rss": [r["peak_rss"] for r in ranks],
        "losses": [round(v, 6) for v in ranks[0]["losses"][:3]],
        "final_loss": round(ranks[0]["losses"][-1], 6),
    }
    print(json.dumps(res))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
