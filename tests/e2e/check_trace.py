#!/usr/bin/env python3
"""check_trace.py DIR RANKS STEPS [LISTS] — the per-rank Chrome traces of log.trace.

Each DIR/rankR.json must be strict JSON (the object form, {"traceEvents": [...]}), its
complete events ("X") carry pid = R, a known lane (tid) and name, ts >= 0 and dur >= 0,
the steps 1..STEPS exactly (args.step), one "step" span per step, and spans of one lane
must not overlap. With LISTS (sched_lists.lua's output: "stage op mb chunk" per compute
instruction of the schedule; a run of pp ranks only, so rank R is stage R) every step's
compute spans on rank R are, in time order, exactly stage R's FWD/BWD/BWD_INPUT/
BWD_WEIGHT instructions (so every micro-batch's forward and backward is there), and the
trace has the transfers and idle spans a stage has, and every span of a pipeline
instruction says what it cost the process (args cpu_ms, faults, preempt: finite, >= 0;
trace.h), the step's CPU no more than its wall time allows.
Prints one line per rank; exits 1 with the reason on the first failure.
"""
import json
import math
import sys

LANES = {
    0: {"forward", "backward", "backward_input", "backward_weight", "optimizer", "idle"},
    1: {"recv_act", "recv_grad", "send_act", "send_grad", "send_wait", "grad_sync",
        "tied_sync", "norm"},
    2: {"step"},
    3: {"allreduce", "reduce_scatter"},
    4: {"a2a"},
}
OPS = {"FWD": "forward", "BWD": "backward", "BWD_INPUT": "backward_input",
       "BWD_WEIGHT": "backward_weight"}


def ns(us):
    return round(us * 1000)


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def strict(path):
    def no_constant(c):
        raise ValueError("non-JSON number %s" % c)
    with open(path) as f:
        try:
            return json.load(f, parse_constant=no_constant)
        except ValueError as e:
            fail("%s is not strict JSON: %s" % (path, e))


def main():
    d, ranks, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    lists = {}
    if len(sys.argv) > 4:
        with open(sys.argv[4]) as f:
            for line in f:
                s, op, mb, chunk = line.split()
                lists.setdefault(int(s), []).append((OPS[op], int(mb), int(chunk)))
    stages = len(lists)
    for r in range(ranks):
        path = "%s/rank%d.json" % (d, r)
        t = strict(path)
        if not isinstance(t, dict) or not isinstance(t.get("traceEvents"), list):
            fail("%s: no traceEvents list" % path)
        spans = [e for e in t["traceEvents"] if e.get("ph") == "X"]
        if not any(e.get("ph") == "M" and e.get("name") == "process_name" for e in t["traceEvents"]):
            fail("%s: no process_name metadata" % path)
        by_lane = {}
        for e in spans:
            for k in ("name", "pid", "tid", "ts", "dur", "args"):
                if k not in e:
                    fail("%s: event without %s: %s" % (path, k, e))
            if e["pid"] != r:
                fail("%s: pid %s, want the rank %d" % (path, e["pid"], r))
            if e["tid"] not in LANES or e["name"] not in LANES[e["tid"]]:
                fail("%s: span %s on lane %s" % (path, e["name"], e["tid"]))
            if not (math.isfinite(e["ts"]) and e["ts"] >= 0 and math.isfinite(e["dur"]) and e["dur"] >= 0):
                fail("%s: bad ts/dur in %s" % (path, e))
            by_lane.setdefault(e["tid"], []).append(e)
        for lane, es in by_lane.items():
            es.sort(key=lambda e: (e["ts"], e["dur"]))
            for a, b in zip(es, es[1:]):
                # timestamps are whole nanoseconds printed with 3 decimals: exact to 1e-6 us
                # ts and dur are whole nanoseconds written as microseconds with 3 decimals:
                # compare them as integers, since a double sum of two such values at an
                # uptime of hours (ts ~ 1e10) is off by an ulp (~4e-6) either way.
                if ns(a["ts"]) + ns(a["dur"]) > ns(b["ts"]):
                    fail("%s: lane %d: %s at %.3f (+%.3f) overlaps %s at %.3f" % (
                        path, lane, a["name"], a["ts"], a["dur"], b["name"], b["ts"]))
        seen = sorted({e["args"]["step"] for e in spans})
        if seen != list(range(1, steps + 1)):
            fail("%s: steps %s, want 1..%d" % (path, seen, steps))
        if sorted(e["args"]["step"] for e in by_lane.get(2, [])) != list(range(1, steps + 1)):
            fail("%s: not one step span per step" % path)
        names = {e["name"] for e in spans}
        for want in ("forward", "optimizer", "norm", "step"):
            if want not in names:
                fail("%s: no %s span" % (path, want))
        if "backward" not in names and not {"backward_input", "backward_weight"} <= names:
            fail("%s: no backward span (fused, or B and W)" % path)
        if lists:
            stage = r
            for e in spans:
                if "mb" not in e["args"] or e["name"] == "idle":
                    continue
                a = e["args"]
                for k in ("cpu_ms", "faults", "preempt"):
                    v = a.get(k)
                    if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                        fail("%s: %s of step %d mb %d: %s is %r, want a finite number >= 0" % (
                            path, e["name"], a["step"], a["mb"], k, v))
            for step in range(1, steps + 1):  # one thread a rank here: CPU <= wall, with slack
                cpu = sum(e["args"]["cpu_ms"] for e in spans if e["args"]["step"] == step and
                          "cpu_ms" in e["args"])
                wall = sum(e["dur"] / 1000 for e in spans if e["args"]["step"] == step and
                           "cpu_ms" in e["args"])
                if cpu > 1.5 * wall + 5:
                    fail("%s: step %d: instructions took %.1f ms of CPU in %.1f ms" % (
                        path, step, cpu, wall))
            for want in (["recv_act"] if stage > 0 else []) + (["send_act"] if stage < stages - 1 else []) + ["idle"]:
                if want not in names:
                    fail("%s: stage %d has no %s span" % (path, stage, want))
            for step in range(1, steps + 1):
                got = [(e["name"], e["args"]["mb"], e["args"]["chunk"]) for e in by_lane[0]
                       if e["args"]["step"] == step and e["name"] not in ("idle", "optimizer")]
                if got != lists[stage]:
                    i = next((i for i, (x, y) in enumerate(zip(got, lists[stage])) if x != y),
                             min(len(got), len(lists[stage])))
                    fail("%s: step %d: compute span %d is %s, the schedule's is %s (%d spans, "
                         "the schedule has %d)" % (path, step, i, got[i] if i < len(got) else None,
                                                   lists[stage][i] if i < len(lists[stage]) else None,
                                                   len(got), len(lists[stage])))
        print("ok %s: %d spans, lanes %s, steps 1..%d%s" % (
            path, len(spans), sorted(by_lane), steps,
            ", compute spans in the schedule's order" if lists else ""))


main()
