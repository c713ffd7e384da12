#!/usr/bin/env python3
"""pp_replay.py TRACE_DIR STAGES — where a pipeline's measured bubble comes from.

Reads the Chrome traces a pp run wrote (log.trace: rank0.json .. rankN.json, one per stage,
pp only: no tp or dp in the run) and, for every step after the first, prints three bubbles:

- measured: the run's own figure, 1 - sum(compute) / (P x max over ranks of the phase),
  each rank's phase from its first instruction to its last send completed (session.c);
- common clock: the same with the makespan taken on the shared monotonic clock, from the
  earliest rank's phase start to the latest rank's end (a rank that starts its phase late
  because it was still in the previous step's optimizer shows up here, not above);
- replay: the schedule run again on paper with each F/B/W taking exactly the time the
  trace measured for it and every transfer free and instant (a RECV waits only for its
  SEND's compute to be done): the traced lists and times handed to `loom schedule
  --costs`, the core's own simulator (core/train/schedule_sim.c; LOOM names the binary,
  default build/loom). measured - replay is what the engine and the transport cost
  (sends, receives, wake-ups, time a rank was not scheduled); replay - formula is what
  unequal compute costs cost (load, micro-batch-to-micro-batch spread, stage imbalance);
- replay_cpu: the same replay with each F/B/W taking its CPU time (args cpu_ms, trace.h)
  instead of its wall time: the bubble had no instruction waited for a core (another
  process on it, or the host taking the vCPU). replay - replay_cpu is what that waiting
  cost; with it the step's wall - CPU of F/B/W (off_cpu_ms), the involuntary context
  switches inside them (preempt) and their page faults (faults, which an activation or
  state buffer touched for the first time inside the step loop shows);
- replay_stage: the replay with each F/B/W taking the mean CPU time of its kind (F, B or
  W; fused or split) and chunk on its rank in that step: the stages' unequal costs
  without the spread from one micro-batch to the next. replay_cpu - replay_stage is
  what that spread cost (a slow first micro-batch shows here), replay_stage -
  replay_equal what one stage costing more than another cost;
- replay_equal: the replay with every F taking the mean of all F's of the step (every
  rank, every chunk), every B and every W likewise: equal stages at the measured ratios
  of F, B and W. For gpipe, 1f1b and interleaved it is the formula (the ratio does not
  enter it); for zb1 it is ZB-H1's bubble at those costs, which the equal-cost formula
  (F = B = W) is not: t_f, t_b and t_w (the means, CPU ms) give Qi et al.'s closed form
  (p-1)(t_f+t_b-t_w) / (m(t_f+t_b+t_w) + (p-1)(t_f+t_b-t_w)), zb_formula() below.

Prints one JSON line per step and a last line with the means:
{"step":..,"measured":..,"common_clock":..,"replay":..,"replay_cpu":..,"replay_stage":..,
 "replay_equal":..,"t_f":..,"t_b":..,"t_w":..,"compute_ms":[..],"phase_ms":[..],
 "off_cpu_ms":[..],"preempt":[..],"faults":[..]}  (lists: one per rank; t_w 0 without W)
"""
import json
import os
import re
import subprocess
import sys
import tempfile

COMPUTE = {"forward", "backward", "backward_input", "backward_weight"}  # trace.c's names


def load(trace_dir, stages):
    ranks = []
    for r in range(stages):
        with open(f"{trace_dir}/rank{r}.json") as f:
            ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
        ranks.append(sorted(ev, key=lambda e: e["ts"]))
    return ranks


def step_ops(ev, step, cpu=False):
    """This rank's compute instructions and receives of one step, in the order they ran;
    each compute's time its wall time, or with cpu its CPU time (a trace without cpu_ms:
    its wall time)."""
    ops = []
    for e in ev:
        a = e.get("args", {})
        if a.get("step") != step:
            continue
        n = e["name"]
        if e.get("tid") == 0 and n in COMPUTE:
            t = a["cpu_ms"] if cpu and "cpu_ms" in a else e["dur"] / 1000.0
            ops.append(("compute", n, a["mb"], a["chunk"], t))
        elif n in ("recv_act", "recv_grad", "send_act", "send_grad"):
            ops.append((n, n, a["mb"], a["chunk"], 0.0))
    return ops


def phase(ev, step):
    """(start, end) of this rank's pipeline phase on the shared clock, ms: its first
    compute-lane span (an instruction or the idle before it) to its send_wait's end."""
    lane = [e for e in ev if e.get("args", {}).get("step") == step and
            (e.get("tid") == 0 and e["name"] in COMPUTE | {"idle"} or e["name"] == "send_wait")]
    start = min(e["ts"] for e in lane)
    end = max(e["ts"] + e["dur"] for e in lane)
    return start / 1000.0, end / 1000.0


def costs(ev, step):
    """(wall - CPU ms, preemptions, page faults) of this rank's F/B/W in one step."""
    off = pre = flt = 0
    for e in ev:
        a = e.get("args", {})
        if a.get("step") == step and e.get("tid") == 0 and e["name"] in COMPUTE and "cpu_ms" in a:
            off += max(0.0, e["dur"] / 1000.0 - a["cpu_ms"])
            pre += a["preempt"]
            flt += a["faults"]
    return off, pre, flt


OPS = {"forward": "FWD", "backward": "BWD", "backward_input": "BWD_INPUT",
       "backward_weight": "BWD_WEIGHT", "recv_act": "RECV_ACT", "recv_grad": "RECV_GRAD",
       "send_act": "SEND_ACT", "send_grad": "SEND_GRAD"}  # trace.c's names -> sched ops
LOOM = os.environ.get("LOOM", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                           "build", "loom"))


def replay(per_rank, stages):
    """Makespan of the traced lists with their measured compute times and free transfers:
    core/train/schedule_sim.c's simulator (`loom schedule FILE.lua --costs`, the one that
    validates every schedule), given each stage's list as traced and each instruction's
    time."""
    mb = 1 + max(o[2] for ops in per_rank for o in ops)
    chunks = 1 + max(o[3] for ops in per_rank for o in ops)
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "traced.lua"), "w") as f:
            f.write("local lists = {\n")
            for ops in per_rank:
                f.write("  {" + ", ".join('{op = "%s", mb = %d, chunk = %d}' % (OPS[o[1]], o[2], o[3])
                                          for o in ops) + "},\n")
            f.write("}\nreturn function(shape) return lists[shape.stage + 1] end\n")
        with open(os.path.join(d, "costs.json"), "w") as f:
            json.dump({"each": [[o[4] for o in ops] for ops in per_rank]}, f)
        run = subprocess.run([LOOM, "schedule", os.path.join(d, "traced.lua"), "--pp", str(stages),
                              "--micro", str(mb), "--chunks", str(chunks), "--costs",
                              os.path.join(d, "costs.json")], capture_output=True, text=True)
    m = re.search(r"^makespan ([0-9.e+-]+)$", run.stdout, re.M)
    if run.returncode != 0 or not m:
        sys.exit("pp_replay: loom schedule could not replay the traced lists (was the run pp "
                 "only, and the trace complete?): " + (run.stderr or run.stdout).strip())
    return float(m.group(1))


def kind(name):
    """F, B or W: a fused backward counts as a B (it has no W)."""
    return {"forward": "F", "backward": "B", "backward_input": "B", "backward_weight": "W"}[name]


def averaged(per_rank, key):
    """The lists with each compute's time the mean of its group, key(rank, op) naming the
    group."""
    groups = {}
    for r, ops in enumerate(per_rank):
        for o in ops:
            if o[0] == "compute":
                groups.setdefault(key(r, o), []).append(o[4])
    mean = {k: sum(v) / len(v) for k, v in groups.items()}
    lists = [[o[:4] + (mean[key(r, o)],) if o[0] == "compute" else o for o in ops]
             for r, ops in enumerate(per_rank)]
    return lists


def zb_formula(p, m, t_f, t_b, t_w):
    """ZB-H1's bubble fraction at per-pass costs t_f, t_b, t_w (Qi et al. 2024: bubble
    time (p-1)(t_f + t_b - t_w) against 1F1B's (p-1)(t_f + t_b + t_w)); with t_f = t_b =
    t_w it is loom schedule's (p-1)/(3m+p-1). None outside where it holds, m >= p and
    t_w <= min(t_f, t_b) (a W no longer than the F and B whose gap it fills; there the
    simulator's zb1 list gives it exactly, and past it more: W = 1.2 F gives 0.072 at
    p = 2, m = 4, F = B, against the form's 0.059)."""
    if m < p or t_w > min(t_f, t_b):
        return None
    bub = (p - 1) * (t_f + t_b - t_w)
    return bub / (m * (t_f + t_b + t_w) + bub)


def analyse(trace_dir, P, out=None):
    """The per-step rows and their means (measured, common_clock, replay)."""
    ranks = load(trace_dir, P)
    steps = sorted({e["args"]["step"] for e in ranks[0] if "step" in e.get("args", {})})
    rows = []
    for step in steps[1:]:
        per_rank = [step_ops(ev, step) for ev in ranks]
        comp = [sum(o[4] for o in ops if o[0] == "compute") for ops in per_rank]
        ph = [phase(ev, step) for ev in ranks]
        walls = [e - s for s, e in ph]
        common = max(e for _, e in ph) - min(s for s, _ in ph)
        total = sum(comp)
        per_cpu = [step_ops(ev, step, cpu=True) for ev in ranks]
        total_cpu = sum(o[4] for ops in per_cpu for o in ops if o[0] == "compute")
        c = [costs(ev, step) for ev in ranks]
        per_stage = averaged(per_cpu, lambda r, o: (r, kind(o[1]), o[3]))
        per_equal = averaged(per_cpu, lambda r, o: kind(o[1]))
        t = {k: [o[4] for ops in per_cpu for o in ops if o[0] == "compute" and kind(o[1]) == k]
             for k in "FBW"}
        row = {"step": step,
               "measured": 1 - total / (P * max(walls)),
               "common_clock": 1 - total / (P * common),
               "replay": 1 - total / (P * replay(per_rank, P)),
               "replay_cpu": 1 - total_cpu / (P * replay(per_cpu, P)),
               "replay_stage": 1 - total_cpu / (P * replay(per_stage, P)),
               "replay_equal": 1 - total_cpu / (P * replay(per_equal, P)),
               **{"t_" + k.lower(): sum(v) / len(v) if v else 0.0 for k, v in t.items()},
               "compute_ms": [round(c, 2) for c in comp],
               "phase_ms": [round(w, 2) for w in walls],
               "off_cpu_ms": [round(x[0], 2) for x in c],
               "preempt": [x[1] for x in c],
               "faults": [x[2] for x in c]}
        if not all(c > 0 for c in comp):
            sys.exit(f"pp_replay: step {step}: a stage has no compute in the trace")
        rows.append(row)
        if out:
            print(json.dumps(row), file=out)
    if not rows:
        sys.exit(f"pp_replay: {trace_dir}: no step after the first in the traces")
    mean = {k: sum(r[k] for r in rows) / len(rows)
            for k in ("measured", "common_clock", "replay", "replay_cpu", "replay_stage",
                      "replay_equal", "t_f", "t_b", "t_w")}
    for k in ("off_cpu_ms", "preempt", "faults"):  # per rank and step
        mean[k] = sum(sum(r[k]) for r in rows) / (len(rows) * P)
    return rows, mean


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    _, mean = analyse(sys.argv[1], int(sys.argv[2]), sys.stdout)
    print(json.dumps({"mean": mean}))


if __name__ == "__main__":
    main()
