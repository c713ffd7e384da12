#!/usr/bin/env bash
# nonfinite.sh LOOM — a non-finite gradient under dp=2, tp=2, pp=2 and dp=2 with ZeRO 2 and 3
# (the gradient in partitions; ZeRO refuses checkpoints, so no checkpoint part), put there by the
# testing aid LOOM_INJECT_NONFINITE=STEP:RANK:PARAM (world rank 1's gradient of PARAM gets
# an inf at step 3, after the reduction, so only that rank holds it):
#  - on_nonfinite = "skip" (the default): exactly step 3 is skipped, on every rank; every
#    rank reports step 3, rank 1 and the parameter (on a pp=2 run, one held by stage 1),
#    stderr says so once, and the JSONL line of step 3 carries it with the skip count; every
#    rank's weights and optimizer state after step 3 hash the same as after step 2 (and
#    step 4 changes them again);
#  - on_nonfinite = "stop": the run exits non-zero with the message naming step, rank and
#    parameter, trains no step after it and saves no checkpoint of step 3: the newest stays
#    step 2's, intact (its manifest's hashes check);
#  - several injected at once (on one rank or two, at dp=2, tp=2, pp=2): every rank reports
#    the first in (pipeline stage, parameter-table index, rank) order; an overflowing loss
#    (sgd at lr 1e30, nothing injected) is reported as the loss, on rank 0;
#  - a malformed injection and an on_nonfinite that is neither "skip" nor "stop" are refused
#    naming what would work.
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
recipe=$here/recipes/nonfinite.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive   # several ranks share 2 cores: OpenMP must not spin
model="model.heads=4 threads=1 comm_timeout=20"

for layout in "dp mesh.dp=2 batch.micro=2|h.0.attn.qkv.weight" \
              "tp mesh.tp=2|h.0.attn.qkv.weight" \
              "pp mesh.pp=2 microbatches=2 batch.micro=2|h.1.mlp.fc.weight" \
              "zero2 mesh.dp=2 batch.micro=2 strategy.zero=2|h.1.mlp.proj.weight" \
              "zero3 mesh.dp=2 batch.micro=2 strategy.zero=3|h.1.mlp.proj.weight"; do
  args=${layout%|*}; param=${layout#*|}; name=${args%% *}; args=${args#* }
  out=$tmp/$name; mkdir -p "$out"
  LOOM_INJECT_NONFINITE=3:1:$param "$loom" launch -n 2 "$recipe" $model $args \
    log.jsonl="$out/m.jsonl" > "$out/skip" 2> "$out/skip.err"
  # every rank's lines, the "[rank 1] " prefix dropped
  for r in 0 1; do
    if [ $r = 0 ]; then grep -v '^\[rank' "$out/skip"; else sed -n "s/^\[rank $r\] //p" "$out/skip"; fi > "$out/r$r"
    skipped=$(awk '$1 == "SKIP" && $3 == "true" { printf "%s ", $2 }' "$out/r$r")
    [ "$skipped" = "3 " ] || { echo "$name rank $r: skipped steps '$skipped', want '3 '"; cat "$out/skip"; exit 1; }
    [ "$(grep -c '^SKIP' "$out/r$r")" -eq 5 ] || { echo "$name rank $r: not 5 steps"; exit 1; }
    report=$(grep '^NONFINITE' "$out/r$r")
    [ "$report" = "NONFINITE 3 1 $([ $name = pp ] && echo 1 || echo 0) $param" ] ||
      { echo "$name rank $r: report '$report'"; exit 1; }
    h2=$(awk '$1 == "HASH" && $2 == 2 { print $3, $4 }' "$out/r$r")
    h3=$(awk '$1 == "HASH" && $2 == 3 { print $3, $4 }' "$out/r$r")
    h4=$(awk '$1 == "HASH" && $2 == 4 { print $3, $4 }' "$out/r$r")
    [ -n "$h2" ] && [ "$h2" = "$h3" ] || { echo "$name rank $r: the skipped step changed the state: '$h2' -> '$h3'"; exit 1; }
    [ "${h3% *}" != "${h4% *}" ] && [ "${h3#* }" != "${h4#* }" ] || { echo "$name rank $r: step 4 did not change the state"; exit 1; }
  done
  finite_losses "$out/r0"
  msg="step 3: non-finite gradient on rank 1$([ $name = pp ] && echo ' (pipeline stage 1)' || true), first in parameter '$param'"
  [ "$(grep -cF "$msg; update skipped on every rank" "$out/skip.err")" -eq 1 ] ||
    { echo "$name: stderr does not say '$msg' once:"; cat "$out/skip.err"; exit 1; }
  j=$(grep '"step":3,' "$out/m.jsonl")
  for want in '"skipped":true' '"skipped_steps":1' "\"param\":\"$param\"" '"rank":1'; do
    [[ $j == *"$want"* ]] || { echo "$name: JSONL step 3 lacks $want: $j"; exit 1; }
  done
  grep '"step":4,' "$out/m.jsonl" | grep -q '"skipped":false,"skipped_steps":1' ||
    { echo "$name: JSONL step 4: $(grep '"step":4,' "$out/m.jsonl")"; exit 1; }
  echo "ok $name skip: step 3 skipped on both ranks, reported as $msg; weights and optimizer state $h3 after steps 2 and 3 on every rank"

  ck="checkpoint.dir=$out/ck checkpoint.every=1"
  [[ $name == zero* ]] && ck=  # ZeRO refuses checkpoints (docs/ZERO.md)
  set +e
  LOOM_INJECT_NONFINITE=3:1:$param "$loom" launch -n 2 "$recipe" $model $args on_nonfinite=stop \
    $ck > "$out/stop" 2> "$out/stop.err"
  rc=$?
  set -e
  [ $rc -ne 0 ] || { echo "$name stop: exit 0"; exit 1; }
  grep -qF "$msg; the run stops (on_nonfinite = \"stop\")" "$out/stop.err" ||
    { echo "$name stop: no message '$msg':"; cat "$out/stop.err"; exit 1; }
  steps=$(awk '$1 == "LOSS" { printf "%s ", $2 }' "$out/stop")
  [ "$steps" = "1 2 " ] || { echo "$name stop: trained steps '$steps'"; exit 1; }
  [ -z "$ck" ] && { echo "ok $name stop: exit $rc, $(grep -o 'step 3: non-finite.*stops' "$out/stop.err" | head -1)"; continue; }
  [ "$(cat "$out/ck/latest")" = step_00000002 ] && [ ! -e "$out/ck/step_00000003" ] ||
    { echo "$name stop: checkpoints $(ls "$out/ck")"; exit 1; }
  # the newest checkpoint intact: a resume from it loads (it checks every file's hash)
  "$loom" launch -n 2 "$recipe" $model $args resume="$out/ck/step_00000002" > "$out/resumed"
  [ "$(grep -c '^LOSS' "$out/resumed")" -eq 3 ] || { echo "$name stop: resume from step 2"; exit 1; }
  echo "ok $name stop: exit $rc, $(grep -o 'step 3: non-finite.*stops' "$out/stop.err" | head -1); newest checkpoint step 2 resumes"
done

# Several at once: the report names the first in (pipeline stage, table index, rank) order,
# the same on every rank; a loss that overflows (sgd at lr 1e30) is named before any gradient.
names() { # expected env args...: every rank's NONFINITE line of step 4 must be expected
  local want=$1 env=$2; shift 2
  LOOM_INJECT_NONFINITE=$env "$loom" launch -n 2 "$recipe" $model "$@" > "$tmp/several" 2> /dev/null
  local got; got=$(sed 's/^\[rank [0-9]*\] //' "$tmp/several" | grep '^NONFINITE' | sort -u | tr '\n' ';')
  [ "$got" = "$want;" ] || { echo "$env with $*: reports '$got', want '$want'"; exit 1; }
  echo "ok $* with $env: every rank reports $want"
}
names "NONFINITE 4 1 0 h.0.ln_1.weight" 4:0:h.1.ln_1.weight,4:1:h.0.ln_1.weight:nan,4:1:h.1.mlp.fc.weight \
  mesh.dp=2 batch.micro=2
names "NONFINITE 4 0 0 h.0.ln_1.weight" 4:1:h.0.ln_1.weight,4:0:h.0.ln_1.weight mesh.dp=2 batch.micro=2
names "NONFINITE 4 1 0 h.0.attn.qkv.weight" 4:1:h.0.mlp.fc.weight,4:1:h.0.attn.qkv.weight mesh.tp=2
names "NONFINITE 4 0 0 h.0.mlp.proj.bias" 4:1:h.1.ln_1.weight,4:0:h.0.mlp.proj.bias mesh.pp=2 microbatches=2 batch.micro=2
"$loom" launch -n 2 "$recipe" $model mesh.dp=2 batch.micro=2 'optimizer={"sgd",lr=1e30}' lr=1e30 grad_clip=0 \
  > "$tmp/overflow" 2> "$tmp/overflow.err"
[ "$(grep '^NONFINITE' "$tmp/overflow" | head -1)" = "NONFINITE 2 0 0 loss" ] &&
  grep -q "step 2: non-finite loss on rank 0; update skipped" "$tmp/overflow.err" ||
  { echo "sgd at lr 1e30: $(grep '^NONFINITE' "$tmp/overflow" | head -1) $(cat "$tmp/overflow.err")"; exit 1; }
echo "ok dp=2, sgd at lr 1e30: $(head -1 "$tmp/overflow.err")"

set +e
LOOM_INJECT_NONFINITE=3:1 "$loom" run "$recipe" > "$tmp/bad1" 2>&1; rc1=$?
"$loom" run "$recipe" on_nonfinite=halt > "$tmp/bad2" 2>&1; rc2=$?
set -e
[ $rc1 -ne 0 ] && grep -q 'LOOM_INJECT_NONFINITE="3:1" has 2 fields; LOOM_INJECT_NONFINITE must be STEP:RANK:PARAM' "$tmp/bad1" ||
  { echo "malformed injection not refused: $(cat "$tmp/bad1")"; exit 1; }
[ $rc2 -ne 0 ] && grep -q "nonfinite.lua:[0-9]*: .*on_nonfinite.*skip, stop" "$tmp/bad2" ||
  { echo "on_nonfinite=halt not refused: $(cat "$tmp/bad2")"; exit 1; }
grep -q '^LOSS' "$tmp/bad1" "$tmp/bad2" && { echo "trained before refusing"; exit 1; }
echo "ok refused: $(tail -1 "$tmp/bad1" | cut -c1-160)"
echo "ok refused: $(tail -1 "$tmp/bad2")"
