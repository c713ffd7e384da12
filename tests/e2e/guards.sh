#!/usr/bin/env bash
# guards.sh LOOM — numerical guards (scripts/loom/guard.lua), on recipes/guards.lua whose lr
# is multiplied 300x once at step 12 (LR_SPIKE_AT) or goes to 1e30 from step 9:
#  - on_spike = "warn" | "skip" | "stop" | "rollback" (window 8, threshold 6): the spike is
#    found at step 13 and named with its z-score; warn applies the update, skip does not,
#    stop exits non-zero, rollback reloads step 10's checkpoint, skips the data of steps
#    11-13 (the rerun step 11 reads other data: its loss differs) and trains to the end;
#  - on_nonfinite = "rollback" whose cause comes back (an injected inf at step 7, every time
#    step 7 runs): 3 rollbacks, then the run stops naming spike.max_rollbacks;
#  - the diverging run of issue 17 (lr 1e30 from step 9, checkpoint every 2, keep = 3): it
#    stops after max_skipped steps in a row and retention kept the last good checkpoint
#    (step 8) beside the 3 newest, which are all diverged;
#  - an lr function returning inf is refused at that step, naming step and value;
#  - rollback without checkpoint.dir and spike{} without on_spike are refused at start.
set -uo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
recipe=$here/recipes/guards.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
det="spike.window=8 spike.threshold=6"
# step 13's line, its numbers left out (they are this machine's float sums)
spike_re='^loom: step 13: loss spike: loss [0-9.]+ \(z [0-9.]+ against [0-9.]+ \+- [0-9.]+ over the last 8 steps\)'


"$loom" run "$recipe" > "$tmp/plain.out" 2>&1 || fail "the plain run failed"
grep -q "spike" "$tmp/plain.out" && fail "the plain run reports a spike"

LR_SPIKE_AT=12 "$loom" run "$recipe" on_spike=warn $det > "$tmp/warn.out" 2>&1 || fail "warn: exit $?"
grep -qE "$spike_re; the update was applied \(on_spike = \"warn\"\)" "$tmp/warn.out" || { grep '^loom:' "$tmp/warn.out"; fail "warn: no line"; }
grep -q '^SKIP' "$tmp/warn.out" && fail "warn skipped an update"
echo "ok warn: $(grep -oE "${spike_re#^loom: }" "$tmp/warn.out" | head -1), update applied"

LR_SPIKE_AT=12 "$loom" run "$recipe" on_spike=skip $det > "$tmp/skip.out" 2>&1 || fail "skip: exit $?"
grep -qE "$spike_re; update skipped on every rank \(on_spike = \"skip\"\)" "$tmp/skip.out" || fail "skip: no line"
grep -qx 'SKIP 13' "$tmp/skip.out" || fail "skip: step 13's update was applied"
echo "ok skip: step 13 skipped"

LR_SPIKE_AT=12 "$loom" run "$recipe" on_spike=stop $det > "$tmp/stop.out" 2>&1 && fail "stop: exit 0"
grep -qE "$spike_re; the run stops \(on_spike = \"stop\"\), the step's update not applied" "$tmp/stop.out" || fail "stop: no line"
grep -q '^LOSS 14 ' "$tmp/stop.out" && fail "stop: trained on"
echo "ok stop: exit non-zero at step 13"

LR_SPIKE_AT=12 "$loom" run "$recipe" on_spike=rollback $det checkpoint.dir="$tmp/rb" checkpoint.every=5 \
  > "$tmp/rb.out" 2>&1 || { tail -3 "$tmp/rb.out"; fail "rollback: exit $?"; }
grep -qF "loom: step 13: rolled back to $tmp/rb/step_00000010 (step 10) and skipped the data of steps 11-13; training goes on from step 11 (rollback 1 of at most 3)" "$tmp/rb.out" ||
  { grep '^loom:' "$tmp/rb.out"; fail "rollback: no line"; }
[[ $(grep -c '^LOSS 11 ' "$tmp/rb.out") -eq 2 ]] || fail "rollback: step 11 did not run twice"
first=$(grep '^LOSS 11 ' "$tmp/rb.out" | head -1 | cut -d' ' -f3) again=$(grep '^LOSS 11 ' "$tmp/rb.out" | tail -1 | cut -d' ' -f3)
[[ $first != "$again" ]] || fail "rollback: the rerun step 11 read the same data"
grep '^LOSS' "$tmp/rb.out" | tail -1 | grep -q '^LOSS 30 ' || fail "rollback: did not train to step 30"
grep '^LOSS' "$tmp/rb.out" | tail -20 > "$tmp/rb.after"   # steps 11-30 after the rollback
finite_losses "$tmp/rb.after"
echo "ok rollback: to step 10, data of 11-13 skipped (rerun step 11 loss $first -> $again), on to step 30"

LOOM_INJECT_NONFINITE=7:0:h.0.attn.qkv.weight "$loom" run "$recipe" on_nonfinite=rollback \
  checkpoint.dir="$tmp/nf" checkpoint.every=5 > "$tmp/nf.out" 2>&1 && fail "repeated rollback: exit 0"
[[ $(grep -c "rolled back to $tmp/nf/step_00000005" "$tmp/nf.out") -eq 3 ]] || fail "repeated rollback: not 3 rollbacks"
grep -qF "3 rollbacks already (spike.max_rollbacks = 3): the run stops" "$tmp/nf.out" || fail "repeated rollback: no stop line"
echo "ok on_nonfinite=rollback whose cause returns: 3 rollbacks, then stopped"

LR_DIVERGE_AT=9 "$loom" run "$recipe" checkpoint.dir="$tmp/div" checkpoint.every=2 checkpoint.keep=3 max_skipped=9 \
  > "$tmp/div.out" 2>&1 && fail "diverging run: exit 0"
grep -qF "loom: steps 10-18: 9 steps in a row skipped (non-finite or spikes): the run has diverged and stops; the last good checkpoint is $tmp/div/step_00000008 (step 8), kept by retention" "$tmp/div.out" ||
  { grep '^loom:' "$tmp/div.out" | tail -2; fail "diverging run: no stop line"; }
kept=$(cd "$tmp/div" && echo step_*)
[[ $kept == "step_00000008 step_00000012 step_00000014 step_00000016" ]] || fail "diverging run: kept $kept"
echo "ok diverging run (lr 1e30 from step 9, keep=3): stopped after 9 skipped steps; kept $kept"

out=$(LR_SPIKE_AT=12 LR_SPIKE=1e999 "$loom" run "$recipe" 2>&1) && fail "lr inf: accepted"
grep -qF "guards.lua:11: lr schedule returned inf at step 12 (want a finite number >= 0)" <<<"$out" || fail "lr inf: $out"
grep -q '^LOSS 12 ' <<<"$out" && fail "lr inf: step 12 trained"
echo "ok lr function returning inf at step 12: refused naming step and value"

out=$("$loom" run "$recipe" on_spike=rollback 2>&1) && fail "rollback without checkpoint: accepted"
grep -qF 'on_spike="rollback" (from the command line: on_spike=rollback) reloads the last good checkpoint, and this run saves none' <<<"$out" || fail "$out"
out=$("$loom" run "$recipe" spike.window=3 2>&1) && fail "spike without on_spike: accepted"
grep -qF 'spike = {...} tunes the loss-spike detector, and on_spike is not set' <<<"$out" || fail "$out"
echo "ok refused at start: rollback without checkpoint.dir, spike{} without on_spike"
