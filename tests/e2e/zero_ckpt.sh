#!/usr/bin/env bash
# zero_ckpt.sh LOOM — checkpoints under ZeRO (docs/ZERO.md "Checkpoints"), loom launch and
# shm, on pp.sh's small model (4 blocks, 4 heads), 6 steps with a save at 3; the global
# batch is 8 sequences in every layout:
#  - the same layout resumes bitwise (steps 4-6 equal the uninterrupted run's): zero = 1, 2
#    and 3 on dp=2, zero=1 on dp=3 (partitions padded past the buffer's end);
#  - across layouts, within 2e-5 of one rank's losses (fast mode): zero=1 dp=4 -> zero=3
#    dp=2, zero=2 dp=2 x tp=2 -> zero=0 one rank, zero=2 dp=2 -> zero=3 dp=4 and zero=3
#    pp=2 x dp=2 -> zero=1 dp=2;
#  - canonical mode: the same crossings give one rank's uninterrupted losses bitwise;
#  - bf16 zero=1 dp=2 (the fp32 master partitioned, saved as model slices): the same
#    layout bitwise, and resumed at one rank and at dp=4 bitwise one rank in canonical mode;
#  - every dp rank writes its own partition (slice files, checkpoint.h), nothing gathered:
#    the manifest records the stage, dp size and sliced kinds, `loom ckpt info` shows them,
#    zero=2 dp=2 -> zero=3 dp=4 and zero=3 pp=2 x dp=2 -> zero=1 dp=2 load across layouts
#    (fast within 2e-5, canonical bitwise), `loom ckpt export` of zero=3 slices gives one
#    rank's bytes (canonical), and a damaged slice is refused naming its file;
#  - a load puts the state straight into the partition: the peak RSS it adds is no more
#    than the bytes it reads.
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
recipe=$here/recipes/pp_probe.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive   # several ranks share 2 cores: OpenMP must not spin
model="model.heads=4 model.layers=4 threads=1 steps=6"
keep() { grep -E '^(LOSS|NORM) ' || true; }
run() { # ranks args...: rank 0's output
  local n=$1; shift
  if [ "$n" = 1 ]; then "$loom" run "$recipe" $model "$@"; else
    "$loom" launch -n "$n" "$recipe" $model comm_timeout=20 "$@"; fi
}
save3() { run "$@" steps=3 checkpoint.dir="$tmp/ck" > /dev/null; }
resume() { # ranks args...: steps 4-6 after resuming from $tmp/ck's step 3
  run "$@" resume="$tmp/ck/step_00000003" > "$tmp/out"
  grep -q "resumed from $tmp/ck/step_00000003 at step 3" "$tmp/out" ||
    { echo "did not resume"; cat "$tmp/out"; exit 1; }
  keep < "$tmp/out"
}
tail3() { awk '$2 > 3' "$1"; }
steps3() { [ "$(grep -c '^LOSS' "$2")" -eq 3 ] || { echo "$1: expected steps 4-6"; cat "$2"; exit 1; }; }
bitwise() { # name want got
  steps3 "$1" "$3"; finite_losses "$2"
  cmp -s "$2" "$3" || { echo "$1: resumed run differs"; paste "$2" "$3"; exit 1; }
  echo "ok $1: steps 4-6 bitwise"
}
close() { # name want got
  steps3 "$1" "$3"
  local d; d=$(max_loss_diff "$2" "$3")
  below "$d" 2e-5 || { echo "$1: losses differ from one rank by $d"; paste "$2" "$3"; exit 1; }
  echo "ok $1: steps 4-6 within 2e-5 of one rank (max |loss diff| $d)"
}
b8="batch.micro=2 batch.global=8"   # the same 8 sequences a step in every layout
D2="2 mesh.dp=2 $b8"; D3="3 mesh.dp=3 batch.micro=2 batch.global=6"
D4="4 mesh.dp=4 $b8"; T2="4 mesh.dp=2 mesh.tp=2 $b8"

# The same layout, bitwise.
# (the uninterrupted run saves the checkpoint at step 3 itself: a save changes no bits,
# and the resumed steps equal to its own show that too)
for layout in "$D2 strategy.zero=1" "$D2 strategy.zero=2" "$D2 strategy.zero=3" "$D3 strategy.zero=1"; do
  rm -rf "$tmp/ck"; run $layout checkpoint.dir="$tmp/ck" checkpoint.every=3 | keep > "$tmp/full"; tail3 "$tmp/full" > "$tmp/want"
  resume $layout > "$tmp/got"
  bitwise "${layout#* } save + resume" "$tmp/want" "$tmp/got"
done

# bf16: under zero=1/2 each rank keeps only its partition of the fp32 master, so a save
# writes it as model slices (one file per dp rank, as zero=3 does) and a load reads its
# partition's tiles and all-gathers the 16-bit compute copy from them. The same layout
# bitwise; across dp (dp=2 -> one rank and dp=4) bitwise one rank's losses in canonical mode.
bf="$D2 strategy.zero=1 precision=bf16"
rm -rf "$tmp/ck"; run $bf checkpoint.dir="$tmp/ck" checkpoint.every=3 | keep > "$tmp/full"; tail3 "$tmp/full" > "$tmp/want"
ck=$tmp/ck/step_00000003
grep -q '"zero": 1, "dp": 2, "slices": \["model", "optim"\]' "$ck/manifest.json" && [ -f "$ck/model.dp1.safetensors" ] ||
  { echo "bf16 zero=1 dp=2: the master not saved as model slices:"; grep layout "$ck/manifest.json"; ls "$ck"; exit 1; }
resume $bf > "$tmp/got"
bitwise "bf16 zero=1 dp=2 (the master as model slices) save + resume" "$tmp/want" "$tmp/got"
c16="deterministic=canonical precision=bf16"
run 1 $b8 $c16 | keep > "$tmp/one"; tail3 "$tmp/one" > "$tmp/want"
rm -rf "$tmp/ck"; save3 $bf $c16
resume 1 $b8 $c16 > "$tmp/got"
bitwise "canonical bf16 zero=1 dp=2 -> one rank" "$tmp/want" "$tmp/got"
resume $D4 strategy.zero=1 $c16 > "$tmp/got"
bitwise "canonical bf16 zero=1 dp=2 -> zero=1 dp=4" "$tmp/want" "$tmp/got"

# Across layouts: from (save layout) to (resume layout), against one rank.
# One rank's uninterrupted run per mode, made once: $tmp/want_fast, $tmp/want_canonical
# (the canonical one also saves at step 3, for the ckpt export check below).
run 1 $b8 | keep > "$tmp/one"; tail3 "$tmp/one" > "$tmp/want_fast"
rm -rf "$tmp/ck1"; run 1 deterministic=canonical $b8 checkpoint.dir="$tmp/ck1" checkpoint.every=3 | keep > "$tmp/one"
tail3 "$tmp/one" > "$tmp/want_canonical"
cross() { # mode save-layout resume-layout (layouts as "ranks args", quoted)
  local mode=$1 from=$2 to=$3 extra="$b8"
  [ "$mode" = canonical ] && extra="deterministic=canonical $b8"
  cp "$tmp/want_$mode" "$tmp/want"
  rm -rf "$tmp/ck"; save3 $from $extra
  resume $to $extra > "$tmp/got"
  if [ "$mode" = canonical ]; then bitwise "canonical ${from#* } -> ${to#* }" "$tmp/want" "$tmp/got"
  else close "${from#* } -> ${to#* }" "$tmp/want" "$tmp/got"; fi
}
P2="4 mesh.pp=2 mesh.dp=2 microbatches=2 $b8"
cross fast "$D4 strategy.zero=1" "$D2 strategy.zero=3"
# The manifest (the checkpoint the last cross saved) and ckpt info: slice files per dp rank.
ck=$tmp/ck/step_00000003
grep -q '"layout": {"tp": 1, "zero": 1, "dp": 4, "slices": \["optim"\]}' "$ck/manifest.json" ||
  { echo "manifest does not record zero=1 dp=4 with optim slices:"; grep layout "$ck/manifest.json"; exit 1; }
for f in model optim.dp0 optim.dp1 optim.dp2 optim.dp3; do
  [ -f "$ck/$f.safetensors" ] || { echo "no $f.safetensors in $ck:"; ls "$ck"; exit 1; }
done
"$loom" ckpt info "$ck" > "$tmp/info"
grep -q "saved under zero=1 over dp=4 (each dp rank's partition in its own optim slice files" "$tmp/info" ||
  { echo "ckpt info does not show the zero layout"; cat "$tmp/info"; exit 1; }
grep -q "^  optim.dp3.safetensors " "$tmp/info" || { echo "ckpt info does not list optim.dp3"; cat "$tmp/info"; exit 1; }
echo "ok manifest layout records zero=1 dp=4 and optim slices; one optim file per dp rank; ckpt info shows them"
cross fast "$T2 strategy.zero=2" "1"
cross fast "$D2 strategy.zero=2" "$D4 strategy.zero=3"
cross fast "$P2 strategy.zero=3" "$D2 strategy.zero=1"
cross canonical "$D4 strategy.zero=1" "$D2 strategy.zero=3"
cross canonical "$T2 strategy.zero=2" "1"
cross canonical "$P2 strategy.zero=3" "$D2 strategy.zero=1"

# Slice files under zero=3 (model and optim per dp rank): ckpt export gives the bytes of one
# rank's export (canonical mode: the same weights), and a damaged slice is refused by name.
c="deterministic=canonical $b8"
"$loom" ckpt export "$tmp/ck1/step_00000003" "$tmp/one.safetensors" > /dev/null # one rank's, saved above
rm -rf "$tmp/ck"; save3 $D2 strategy.zero=3 $c
[ -f "$ck/model.dp1.safetensors" ] || { echo "zero=3: no model.dp1.safetensors"; ls "$ck"; exit 1; }
"$loom" ckpt export "$ck" "$tmp/z3.safetensors" > /dev/null
data() { # the tensor bytes of a safetensors file, after its header (its metadata's key order varies)
  local n; n=$(od -An -t u8 -N 8 "$1" | tr -d ' '); tail -c +$((9 + n)) "$1"
}
cmp -s <(data "$tmp/one.safetensors") <(data "$tmp/z3.safetensors") || { echo "ckpt export of zero=3 dp=2 slices differs from one rank's"; exit 1; }
echo "ok ckpt export of a zero=3 dp=2 checkpoint (model and optim slices): tensor bytes equal to one rank's export"
# A ZeRO-3 load reads only its partition's tiles of the optimizer state and of the
# parameters (LOOM_CKPT_STATS=1: "read R of T bytes"): half of each here, plus the tiles a
# piece boundary shares (it read all the parameters, 0.67 of the bytes, until it read
# only its partition of them).
LOOM_CKPT_STATS=1 "$loom" launch -n 2 "$recipe" $model comm_timeout=20 mesh.dp=2 strategy.zero=3 $c \
  resume="$ck" 2>&1 | grep -a -o 'read [0-9]* of [0-9]* bytes' > "$tmp/stats" || true
[ "$(wc -l < "$tmp/stats")" -eq 2 ] || { echo "expected one read report per rank:"; cat "$tmp/stats"; exit 1; }
awk '{ r = $2 / $4; if (!(r > 0.45 && r < 0.6)) { printf "a rank read %d of %d bytes (%.3f): 0.5 expected\n", $2, $4, r; exit 1 }
       printf "ok a zero=3 dp=2 resume reads %.1f%% of the checkpoint on each rank (its partition of the state and of the parameters)\n", 100 * r; exit }' "$tmp/stats"
size=$(stat -c %s "$ck/optim.dp1.safetensors")
printf '\x7f' | dd of="$ck/optim.dp1.safetensors" bs=1 seek=$((size - 5)) conv=notrunc status=none
if run $D2 strategy.zero=3 $c resume="$ck" > "$tmp/bad" 2>&1; then echo "a damaged slice was loaded"; exit 1; fi
grep -q "optim.dp1.safetensors" "$tmp/bad" || { echo "the refusal does not name the file:"; cat "$tmp/bad"; exit 1; }
if "$loom" ckpt info "$ck" > "$tmp/bad" 2>&1; then echo "ckpt info accepted a damaged slice"; exit 1; fi
grep -q "optim.dp1.safetensors" "$tmp/bad" || { echo "ckpt info does not name the file:"; cat "$tmp/bad"; exit 1; }
echo "ok a damaged slice is refused naming optim.dp1.safetensors (resume and ckpt info)"

# The load's memory (7.2 M parameters, 57.6 MB of AdamW state, dp=2 zero=1, MALLOC_PERTURB_
# set): the state's pieces go straight into each rank's partition, so what a load adds to
# the peak RSS is what it reads (its partition's tiles of the state, all the parameters;
# LOOM_CKPT_STATS), not also a whole-state buffer (which added 57.6 MB more).
lr="$here/recipes/zero_load_rss.lua"
MALLOC_PERTURB_=165 CKPT_SAVE="$tmp/lr" "$loom" launch -n 2 "$lr" mesh.dp=2 strategy.zero=1 > "$tmp/lsave"
MALLOC_PERTURB_=165 LOOM_CKPT_STATS=1 CKPT_LOAD="$tmp/lr/step_00000002" "$loom" launch -n 2 "$lr" \
  mesh.dp=2 strategy.zero=1 > "$tmp/lload" 2>&1
peak0=$(grep -a '^LOADRSS 0 2 ' "$tmp/lsave" | cut -d' ' -f4)
peak1=$(grep -a '^LOADRSS 0 3 ' "$tmp/lload" | cut -d' ' -f4)
readb=$(grep -a -o 'read [0-9]* of' "$tmp/lload" | cut -d' ' -f2 | sort -g | tail -1)
[ -n "$peak0" ] && [ -n "$peak1" ] && [ -n "$readb" ] || { echo "no peak or read report:"; cat "$tmp/lsave" "$tmp/lload" | tail -5; exit 1; }
echo "   peak RSS, rank 0: $peak0 B trained to step 2, $peak1 B resumed there and trained step 3; the load read $readb B"
[ $((peak1 - peak0)) -le $((readb + 8388608)) ] ||
  { echo "a zero=1 load raised the peak RSS by $((peak1 - peak0)) B, more than the $readb B it read (+8 MiB)"; exit 1; }
echo "ok a zero=1 dp=2 load adds $((peak1 - peak0)) B to the peak RSS, no more than the $readb B it reads (+8 MiB)"

