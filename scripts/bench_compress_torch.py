#!/usr/bin/env python3
"""PyTorch PowerSGD over DDP, the peer of scripts/bench-compress's powersgd rows.

bench_torch.py's GPT-2 (imported, not copied: loom's llm.c layout) at the shape of
scripts/recipes/bench_compress.lua (vocab 256, ctx 32, 2 layers, 2 heads, dim 32), trained
the way that recipe trains: tiny Shakespeare's bytes as tokens, the first 90 % the train
split, read as llm.c's loader reads it (B*T+1 consecutive bytes a micro-batch, the position
advancing by B*T and wrapping), the step's dp micro-batches in order, rank r taking the r-th;
SGD lr 1 with loom.lr.cosine{warmup = 3, total = 20, min = 0.1}; gradient clipping at norm 1
(loom.train's default); B = 4 a rank; 200 steps. Ranks are processes under
DistributedDataParallel over gloo. --compress powersgd registers
torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.powerSGD_hook with
matrix_approximation_rank = --rank, start_powerSGD_iter = --warmup (plain all-reduce before:
loom's warm-up), use_error_feedback = True, warm_start = False (loom draws a fresh Q each
step) and min_compression_rate = 1 (compress a matrix whenever its factors are smaller, as
loom does; PyTorch's default 2 would send more of this small model raw). --compress none
keeps DDP's all-reduce.

Two transports, as scripts/bench-compress's links:
  one host: every rank here (torch.multiprocessing spawn), gloo over a FileStore and TCP
            loopback (gloo has no shared-memory transport);
  --nodes: this process starts --local of the --world ranks, from --first, and rendezvouses
           over tcp://--master (gloo on the interface GLOO_SOCKET_IFNAME names): run once in
           each network namespace.

Prints one JSON line (rank 0's process):
  {"impl":"pytorch-ddp-powersgd"|"pytorch-ddp","dp":N,"tokens_per_s":..,"ms_per_step":..,
   "last20":..,"final_loss":..,"steps":..,"params":..}
tokens_per_s counts all ranks' tokens over rank 0's wall time of steps --warmup+1 .. last
(the compressed ones), as the loom recipe's; last20 the mean loss of the last 20 steps.
"""
import argparse
import json
import math
import os
import sys
import tempfile
import time

peer = argparse.ArgumentParser(add_help=False)
peer.add_argument("--dp", type=int, default=2, help="world size (data-parallel ranks)")
peer.add_argument("--compress", choices=["none", "powersgd"], default="powersgd")
peer.add_argument("--rank", type=int, default=2, help="PowerSGD matrix_approximation_rank")
peer.add_argument("--cwarmup", type=int, default=20, help="uncompressed steps first")
peer.add_argument("--total-steps", type=int, default=200)
peer.add_argument("--data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                               "..", "data", "tinyshakespeare.txt"))
peer.add_argument("--master", default="", help="HOST:PORT: multi-node rendezvous")
peer.add_argument("--first", type=int, default=0, help="--master: this node's first rank")
peer.add_argument("--local", type=int, default=0, help="--master: ranks on this node")
pargs, rest = peer.parse_known_args()
if pargs.dp < 1 or pargs.total_steps <= pargs.cwarmup or pargs.rank < 1:
    peer.error("--dp >= 1, --total-steps > --cwarmup and --rank >= 1")
sys.argv = [sys.argv[0]] + rest + ["--vocab", "256", "--ctx", "32", "--layers", "2",
                                   "--heads", "2", "--dim", "32", "--batch", "4", "--threads", "1"]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_torch as bt  # noqa: E402  (sets the thread environment, imports torch)

torch = bt.torch
args = bt.args


def lr_at(step):  # loom.lr.cosine{warmup = 3, total = 20, min = 0.1} with base 1 (scripts/loom/lr.lua)
    warm, total, lo = 3, 20, 0.1
    if step <= warm:
        return step / warm
    if step >= total:
        return lo
    ratio = (step - warm) / max(1, total - warm)
    return lo + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (1.0 - lo)


def rank_main(local, init, out_path, p):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    rank = p["first"] + local
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=p["dp"])
    torch.manual_seed(args.seed)  # every rank the same initial model
    B, T, dp = args.batch, args.ctx, p["dp"]
    model = bt.GPT(256, 256, T, 2, 2, 32)
    model.train()
    ddp = DDP(model)
    if p["compress"] == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
        state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=p["rank"],
                                 start_powerSGD_iter=p["cwarmup"], min_compression_rate=1,
                                 use_error_feedback=True, warm_start=False,
                                 random_seed=args.seed)
        ddp.register_comm_hook(state, ps.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    with open(p["data"], "rb") as f:
        raw = f.read()
    train = torch.tensor(list(raw[:len(raw) - int(len(raw) * 0.1)]), dtype=torch.long)
    pos, losses = 0, []
    for step in range(1, p["total_steps"] + 1):
        if step == p["cwarmup"] + 1:
            dist.barrier()
            t0 = time.perf_counter()
        for i in range(dp):  # the step's micro-batches in order; rank r's is the r-th
            if pos + B * T + 1 > train.numel():
                pos = 0
            if i == rank:
                buf = train[pos:pos + B * T + 1]
                x, y = buf[:-1].view(B, T), buf[1:].view(B, T)
            pos += B * T
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        loss = ddp(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t)  # the step's mean loss over the ranks, as loom's
        losses.append(t.item() / dp)
    dt = time.perf_counter() - t0
    if rank == 0:
        timed = p["total_steps"] - p["cwarmup"]
        res = {"impl": "pytorch-ddp-powersgd" if p["compress"] == "powersgd" else "pytorch-ddp",
               "dp": dp, "tokens_per_s": round(dp * B * T * timed / dt, 1),
               "ms_per_step": round(1000.0 * dt / timed, 3),
               "last20": round(sum(losses[-20:]) / len(losses[-20:]), 4),
               "final_loss": round(losses[-1], 4), "steps": len(losses),
               "params": sum(q.numel() for q in model.parameters())}
        with open(out_path, "w") as f:
            json.dump(res, f)
    # every rank here before any leaves: over tcp:// rank 0 hosts the store, and a rank still
    # tearing down after it has gone was seen to spin at exit; then leave without teardown
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def main():
    import torch.multiprocessing as mp
    p = dict(dp=pargs.dp, compress=pargs.compress, rank=pargs.rank, cwarmup=pargs.cwarmup,
             total_steps=pargs.total_steps, data=pargs.data, first=0)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result")
        if pargs.master:
            p["first"] = pargs.first
            init, n = "tcp://" + pargs.master, pargs.local
        else:
            init, n = "file://" + os.path.join(tmp, "store"), pargs.dp
        mp.spawn(rank_main, args=(init, out, p), nprocs=n, join=True)
        if os.path.exists(out):
            with open(out) as f:
                print(json.dumps(json.load(f)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
