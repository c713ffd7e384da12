#!/usr/bin/env bash
# pp_trace.sh LOOM — log.trace (per-rank Chrome traces) and the measured pipeline bubble:
#  - pp=2 with 1f1b, interleaved (2 chunks) and, where this build trains it, zb1 (B and W
#    spans): every rank's trace is strict JSON in
#    the Trace Event Format, pid = rank, lanes compute / comm / step, spans of a lane
#    never overlap, one step span per step, and each step's compute spans are, in time
#    order, the stage's FWD/BWD instructions of the schedule (every micro-batch's forward
#    and backward on each stage, with its chunk), plus transfers and idle spans
#    (tests/e2e/check_trace.py);
#  - the measured bubble is in every JSONL train line and in the run's summary line,
#    finite and in [0, 1); without a pipeline it is null;
#  - pp=2 x dp=2 (1f1b and zb1, small dp buckets): the dp lane's allreduce span of every
#    step starts before the step's last compute span ends on every rank (the buckets of
#    each chunk's last backward are reduced while the rest of the list runs);
#  - pp=2 x dp=2 with zero=2 (1f1b and zb1, small buckets): on every rank and step the
#    reduce_scatter span of the last backward (or W) starts inside it and is waited for
#    after it; LOOM_ZERO_PP_WAIT=each gives the same losses and norms and fails that check;
#  - at pp = 1 (dp = 2) the traces hold forward, backward, grad_sync and the optimizer;
#  - log.trace_steps = 2 traces steps 1 and 2 only; steps whose update is skipped (non-finite
#    gradients) keep their own step numbers;
#  - a bad log.trace value is refused with a message that names it, and so is a trace file
#    that cannot be written;
#  - a pp run whose activations (micro x seq x dim fp32) are 128 KiB gets shm mailboxes
#    that hold two of them (2 x (bytes + 64), whole pages: core/dist/dist.h), where a run
#    with 16 KiB ones keeps the 128 KiB default: its world segment (2 x 2 mailboxes) is
#    4 x the difference larger.
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
recipe=$here/recipes/pp_probe.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive
model="model.heads=4 model.layers=4 threads=1 comm_timeout=20"
check="python3 $here/check_trace.py"

# bubble_ok FILE.jsonl OUT: every train line's bubble and the summary's in [0, 1)
bubble_ok() {
  python3 - "$1" <<'PY' || exit 1
import json, math, sys
n = 0
for line in open(sys.argv[1]):
    o = json.loads(line)
    if o["kind"] == "train":
        b = o["bubble"]
        if not (isinstance(b, float) and math.isfinite(b) and 0 <= b < 1):
            print("FAIL: step %d bubble %r is not in [0, 1)" % (o["step"], b)); sys.exit(1)
        n += 1
print("ok %d JSONL train lines carry a bubble in [0, 1)" % n)
PY
  local b
  b=$(sed -n 's/^pipeline bubble: measured \([^ ]*\) .*/\1/p' "$2")
  [ -n "$b" ] || { echo "no 'pipeline bubble' summary line"; cat "$2"; exit 1; }
  finite "$b" > /dev/null && below "$b" 1 && ! below "$b" 0 ||
    { echo "summary bubble $b is not in [0, 1)"; exit 1; }
  echo "ok summary: $(grep '^pipeline bubble' "$2")"
}

for layout in "1f1b 1" "interleaved 2"; do
  name=${layout% *}; chunks=${layout#* }; mkdir -p "$tmp/$name"
  "$loom" launch -n 2 "$recipe" $model steps=3 mesh.pp=2 schedule=$name microbatches=4 \
    log.trace="$tmp/$name/trace" log.jsonl="$tmp/$name/m.jsonl" > "$tmp/$name/out" 2>&1 ||
    { cat "$tmp/$name/out"; exit 1; }
  LOOM_SCHED="$name 2 4 $chunks" "$loom" run "$here/sched_lists.lua" > "$tmp/$name/lists"
  $check "$tmp/$name/trace" 2 3 "$tmp/$name/lists"
  bubble_ok "$tmp/$name/m.jsonl" "$tmp/$name/out"
done
grep -q '"chunk":1' "$tmp/interleaved/trace/rank0.json" || { echo "interleaved: no chunk 1 span"; exit 1; }

# The mailbox holds two activations (the sizes of the world's shm segment, pp_mailbox.lua).
shm_of() { "$loom" launch -n 2 "$here/recipes/pp_mailbox.lua" "$@" 2>&1 | sed -n 's/^SHM 0 //p'; }
small=$(shm_of); big=$(shm_of batch.micro=8 model.dim=128)
want=$(( 4 * (((2 * (8 * 32 * 128 * 4 + 64) + 4095) / 4096 * 4096) - 131072) ))
[ -n "$small" ] && [ -n "$big" ] && [ $((big - small)) -eq "$want" ] ||
  { echo "FAIL: shm segment ${small:-?} -> ${big:-?} bytes with 128 KiB activations, want +$want"; exit 1; }
echo "ok shm mailboxes sized for two 128 KiB activations: segment $small -> $big bytes"

# scripts/pp_replay.py on the 1f1b trace: its measured bubble is the run's own summary, and
# its replays (wall and CPU times, each stage's mean costs, equal stages) are bubbles in
# [0, 1); with equal stages 1f1b's is its formula, 1/(m+p-1) = 0.2, whatever F and B cost.
python3 "$here/../../scripts/pp_replay.py" "$tmp/1f1b/trace" 2 > "$tmp/replay" || exit 1
python3 - "$tmp/replay" "$(sed -n 's/^pipeline bubble: measured \([^ ]*\) .*/\1/p' "$tmp/1f1b/out")" <<'PY' || exit 1
import json, math, sys
m = json.loads(open(sys.argv[1]).read().splitlines()[-1])["mean"]
for k in ("measured", "replay", "replay_cpu", "replay_stage", "replay_equal"):
    if not (isinstance(m.get(k), float) and math.isfinite(m[k]) and 0 <= m[k] < 1):
        print("FAIL: pp_replay %s is %r, not in [0, 1)" % (k, m.get(k))); sys.exit(1)
if abs(m["measured"] - float(sys.argv[2])) > 1e-3:
    print("FAIL: pp_replay measured %.5f, the run's summary %s" % (m["measured"], sys.argv[2])); sys.exit(1)
if abs(m["replay_equal"] - 0.2) > 1e-6 or not m["t_f"] > 0 or not m["t_b"] > 0 or m["t_w"] != 0:
    print("FAIL: pp_replay 1f1b at equal stages %.6f, not its formula 0.2 (F %.3f, B %.3f, W %.3f ms)"
          % (m["replay_equal"], m["t_f"], m["t_b"], m["t_w"])); sys.exit(1)
print("ok pp_replay: measured %.4f = the run's, replay %.4f, at CPU times %.4f; %.1f faults a "
      "rank and step; at equal stages %.4f = the formula" % (m["measured"], m["replay"], m["replay_cpu"], m["faults"], m["replay_equal"]))
PY

# zb1's split backward: backward_input (B) and backward_weight (W) spans in the schedule's
# order, where this build trains zb1 (a build whose model has no split backward refuses it).
mkdir -p "$tmp/zb1"
if "$loom" launch -n 2 "$recipe" $model steps=2 mesh.pp=2 schedule=zb1 microbatches=4 \
    log.trace="$tmp/zb1/trace" > "$tmp/zb1/out" 2>&1; then
  LOOM_SCHED="zb1 2 4 1" "$loom" run "$here/sched_lists.lua" > "$tmp/zb1/lists"
  $check "$tmp/zb1/trace" 2 2 "$tmp/zb1/lists"
  grep -q '"name":"backward_weight"' "$tmp/zb1/trace/rank1.json" || { echo "zb1: no W span"; exit 1; }
  # Replayed with equal stages at the measured F, B and W: ZB-H1's closed form at those
  # costs (Qi et al. 2024; pp_replay.zb_formula), which the simulator must reproduce.
  python3 - "$here/../../scripts" "$tmp/zb1/trace" <<'PY' || exit 1
import sys
sys.path.insert(0, sys.argv[1])
import pp_replay
m = pp_replay.analyse(sys.argv[2], 2)[1]
want = pp_replay.zb_formula(2, 4, m["t_f"], m["t_b"], m["t_w"])
if want is None:  # W measured longer than F or B (a loaded machine): the form does not hold
    print("zb1: W %.3f ms > F %.3f or B %.3f ms, outside ZB-H1's closed form: not compared"
          % (m["t_w"], m["t_f"], m["t_b"])); sys.exit(0)
if not (m["t_w"] > 0 and abs(m["replay_equal"] - want) < 1e-6):
    print("FAIL: zb1 replayed at equal stages %.6f, ZB-H1's formula at F %.3f B %.3f W %.3f ms %.6f"
          % (m["replay_equal"], m["t_f"], m["t_b"], m["t_w"], want)); sys.exit(1)
print("ok zb1 at equal stages: %.4f = ZB-H1's formula at the measured F %.1f, B %.1f, W %.1f ms "
      "(%.4f at F = B = W)" % (m["replay_equal"], m["t_f"], m["t_b"], m["t_w"], 1 / 13))
PY
elif grep -q 'cannot train with' "$tmp/zb1/out"; then
  echo "zb1 is refused by this build (no split backward): its trace is checked where it trains"
else
  cat "$tmp/zb1/out"; exit 1
fi

# pp = 2 x dp = 2: each chunk's last backward hands its finished ranges to the dp strategy,
# so (with buckets small enough to fill during it) the all-reduce starts before the
# step's last forward/backward ends, on every rank and step.
overlap_ok() { # DIR RANKS: every step's allreduce span starts before its last compute span ends
  python3 - "$1" "$2" <<'PY'
import json, sys
d, ranks = sys.argv[1], int(sys.argv[2])
compute = {"forward", "backward", "backward_input", "backward_weight"}
lead = []
for r in range(ranks):
    ev = [e for e in json.load(open("%s/rank%d.json" % (d, r)))["traceEvents"] if e.get("ph") == "X"]
    for step in sorted({e["args"]["step"] for e in ev}):
        es = [e for e in ev if e["args"]["step"] == step]
        ar = [e for e in es if e["name"] == "allreduce"]
        end = max(round((e["ts"] + e["dur"]) * 1000) for e in es if e["name"] in compute)
        if len(ar) != 1:
            print("FAIL: rank %d step %d has %d allreduce spans" % (r, step, len(ar))); sys.exit(1)
        start = round(ar[0]["ts"] * 1000)
        if start >= end:
            print("FAIL: rank %d step %d: the all-reduce starts %.3f ms after the last compute span ends"
                  % (r, step, (start - end) / 1e6)); sys.exit(1)
        lead.append((end - start) / 1e6)
print("ok pp x dp: on every rank and step the all-reduce starts before the last compute span ends "
      "(by %.3f to %.3f ms)" % (min(lead), max(lead)))
PY
}
for name in 1f1b zb1; do
  mkdir -p "$tmp/ppdp_$name"
  "$loom" launch -n 4 "$recipe" $model steps=2 mesh.pp=2 mesh.dp=2 schedule=$name microbatches=2 \
    strategy.dp.bucket_mb=0.01 log.trace="$tmp/ppdp_$name/trace" > "$tmp/ppdp_$name/out" 2>&1 ||
    { cat "$tmp/ppdp_$name/out"; exit 1; }
  $check "$tmp/ppdp_$name/trace" 4 2
  overlap_ok "$tmp/ppdp_$name/trace" 4 || exit 1
done

# ZeRO-2 under pp = 2 x dp = 2: the last backward's (or W's) buckets are reduce-scattered
# while it runs and waited for after it (zero.h): on every rank and step the reduce_scatter
# span of that backward (its mb and chunk) starts inside it, at least one of its buckets
# started by the backward's own reports (args during), and ends after it. With
# LOOM_ZERO_PP_WAIT=each (every backward's end waits, as before) the same bits, and the
# check must fail: what it would say of a reduce waited for inside the backward.
zero_overlap_ok() { # DIR RANKS
  python3 - "$1" "$2" <<'PY'
import json, sys
d, ranks = sys.argv[1], int(sys.argv[2])
lead, during = [], []
for r in range(ranks):
    ev = [e for e in json.load(open("%s/rank%d.json" % (d, r)))["traceEvents"] if e.get("ph") == "X"]
    for step in sorted({e["args"]["step"] for e in ev}):
        es = [e for e in ev if e["args"]["step"] == step]
        bw = [e for e in es if e["name"] in ("backward", "backward_weight")]
        if not bw:
            print("FAIL: rank %d step %d has no backward span" % (r, step)); sys.exit(1)
        last = max(bw, key=lambda e: e["ts"])
        b0, b1 = round(last["ts"] * 1000), round((last["ts"] + last["dur"]) * 1000)
        mine = [e for e in es if e["name"] == "reduce_scatter" and e["args"].get("mb") == last["args"]["mb"]
                and e["args"].get("chunk") == last["args"]["chunk"] and b0 <= round(e["ts"] * 1000) < b1]
        if len(mine) != 1:
            print("FAIL: rank %d step %d: %d reduce_scatter spans start inside the last backward (mb %d chunk %d)"
                  % (r, step, len(mine), last["args"]["mb"], last["args"]["chunk"])); sys.exit(1)
        end = round((mine[0]["ts"] + mine[0]["dur"]) * 1000)
        a = mine[0]["args"]
        if not (isinstance(a.get("during"), int) and isinstance(a.get("buckets"), int) and
                1 <= a["during"] <= a["buckets"]):
            print("FAIL: rank %d step %d: of the last backward's %r buckets %r were started by its own "
                  "reports, while it ran (want at least one)" % (r, step, a.get("buckets"), a.get("during")))
            sys.exit(1)
        if end <= b1:
            print("FAIL: rank %d step %d: the last backward's reduce-scatters were waited for inside it "
                  "(%.3f ms before its end)" % (r, step, (b1 - end) / 1e6)); sys.exit(1)
        lead.append(((b1 - round(mine[0]["ts"] * 1000)) / 1e6, (end - b1) / 1e6))
        during.append(a["during"] / a["buckets"])
print("ok zero=2 pp x dp: on every rank and step the last backward's reduce-scatter starts %.3f to %.3f ms "
      "before its end (%.0f%% to %.0f%% of its buckets started by its own reports) and is waited for %.3f to "
      "%.3f ms after it" % (min(a for a, _ in lead), max(a for a, _ in lead), 100 * min(during),
                            100 * max(during), min(b for _, b in lead), max(b for _, b in lead)))
PY
}
# zb1 with 4 micro-batches: a B runs between W's there, which in fast mode adds the layer
# norms' gradients into the buffer (the W's buckets are waited for first: without that wait
# the bits differ from the A/B's, tried)
for name in "1f1b 2" "zb1 4"; do
  m=${name#* }; name=${name% *}
  mkdir -p "$tmp/z2_$name"
  "$loom" launch -n 4 "$recipe" $model steps=2 mesh.pp=2 mesh.dp=2 schedule=$name microbatches=$m \
    strategy.zero=2 strategy.dp.bucket_mb=0.01 log.trace="$tmp/z2_$name/trace" > "$tmp/z2_$name/out" 2>&1 ||
    { cat "$tmp/z2_$name/out"; exit 1; }
  $check "$tmp/z2_$name/trace" 4 2
  zero_overlap_ok "$tmp/z2_$name/trace" 4 || exit 1
done
mkdir -p "$tmp/z2_each"
LOOM_ZERO_PP_WAIT=each "$loom" launch -n 4 "$recipe" $model steps=2 mesh.pp=2 mesh.dp=2 schedule=zb1 \
  microbatches=4 strategy.zero=2 strategy.dp.bucket_mb=0.01 log.trace="$tmp/z2_each/trace" \
  > "$tmp/z2_each/out" 2>&1 || { cat "$tmp/z2_each/out"; exit 1; }
bits() { grep -aE '^(LOSS|NORM|VAL) ' "$1"; }
[ "$(bits "$tmp/z2_zb1/out" | grep -c '^LOSS')" -eq 2 ] && finite_losses "$tmp/z2_zb1/out" &&
  cmp -s <(bits "$tmp/z2_zb1/out") <(bits "$tmp/z2_each/out") ||
  { echo "FAIL: zero=2 zb1: the reduce-scatters waited for later give other bits than waited at each backward"
    paste <(bits "$tmp/z2_zb1/out") <(bits "$tmp/z2_each/out"); exit 1; }
if zero_overlap_ok "$tmp/z2_each/trace" 4 > "$tmp/z2_each/check"; then
  echo "FAIL: the overlap check passed a run that waits at every backward's end"; exit 1
fi
echo "ok zero=2 zb1: waited at each backward's end the same bits, and the overlap check refuses it ($(cat "$tmp/z2_each/check"))"
if LOOM_ZERO_PP_WAIT=soon "$loom" launch -n 2 "$recipe" $model steps=1 mesh.dp=2 strategy.zero=2 \
    > "$tmp/z2_bad" 2>&1; then
  echo "FAIL: LOOM_ZERO_PP_WAIT=soon was accepted"; exit 1
fi
grep -qF 'LOOM_ZERO_PP_WAIT is "soon": "later"' "$tmp/z2_bad" ||
  { echo "FAIL: LOOM_ZERO_PP_WAIT=soon refused without naming it:"; cat "$tmp/z2_bad"; exit 1; }
echo "ok refused (LOOM_ZERO_PP_WAIT=soon)"

# pp = 1, dp = 2: the spans that apply; no bubble.
mkdir -p "$tmp/dp"
"$loom" launch -n 2 "$recipe" $model steps=3 mesh.dp=2 log.trace="$tmp/dp/trace" \
  log.jsonl="$tmp/dp/m.jsonl" > "$tmp/dp/out" 2>&1 || { cat "$tmp/dp/out"; exit 1; }
$check "$tmp/dp/trace" 2 3
grep -q '"name":"grad_sync"' "$tmp/dp/trace/rank1.json" || { echo "dp=2: no grad_sync span"; exit 1; }
grep -q '"bubble":null' "$tmp/dp/m.jsonl" || { echo "dp=2: bubble is not null"; exit 1; }
grep -q '^pipeline bubble' "$tmp/dp/out" && { echo "dp=2 printed a pipeline bubble"; exit 1; }
echo "ok pp = 1 (dp = 2): traces with forward, backward, grad_sync, optimizer; bubble null"

# A window: steps 1 and 2 of 3.
"$loom" launch -n 2 "$recipe" $model steps=3 mesh.pp=2 microbatches=2 log.trace="$tmp/w" \
  log.trace_steps=2 > "$tmp/w.out" 2>&1 || { cat "$tmp/w.out"; exit 1; }
$check "$tmp/w" 2 2

# Skipped updates (lr = 1e30: non-finite gradients from step 2 on) are steps of the trace too.
"$loom" launch -n 2 "$recipe" $model steps=4 mesh.pp=2 microbatches=2 optimizer.lr=1e30 \
  log.trace="$tmp/skip" > "$tmp/skip.out" 2>&1 || { cat "$tmp/skip.out"; exit 1; }
grep -q 'SKIP 4 true' "$tmp/skip.out" || { echo "lr=1e30 did not skip step 4"; exit 1; }
$check "$tmp/skip" 2 4

refused() { # expected-text args...
  local want=$1; shift
  if "$loom" run "$recipe" $model steps=1 "$@" > "$tmp/err" 2>&1; then echo "accepted: $*"; exit 1; fi
  grep -qF -- "$want" "$tmp/err" || { echo "refusal of '$*' lacks '$want':"; cat "$tmp/err"; exit 1; }
  echo "ok refused ($want)"
}
refused 'is empty: give the directory the per-rank traces go to' log.trace=
refused 'cannot create directory' log.trace=/proc/none/trace
refused 'bounds a trace, and log.trace is not set' log.trace_steps=2
refused 'must be string, got number 7' 'log.trace=7'
# A trace that cannot be written (a full disk: rank0.json is /dev/full) stops the run, naming it.
mkdir -p "$tmp/full" && ln -s /dev/full "$tmp/full/rank0.json"
refused "log.trace: writing '$tmp/full/rank0.json' failed (No space left on device)" log.trace="$tmp/full"
