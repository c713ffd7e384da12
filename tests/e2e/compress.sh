#!/usr/bin/env bash
# compress.sh LOOM — gradient compression over dp (strategy.compress, docs/COMPRESS.md) on
# the small test model (34688 parameters in 28 tensors), loom launch and shm:
#  - the exchange itself is exact: topk with ratio = 1 sends every element, and its losses
#    and norms are bitwise those of plain dp (the sum in rank order), with zero = 2 too
#    (the compressed exchange replaces ZeRO's reduce-scatter), and at dp=2 x pp=2;
#  - onebit under zero = 1, 2, 3 gives zero = 0's onebit losses (within 1e-6), and a
#    second run the same bits (same seed, same layout);
#  - 200 steps of SGD (lr 1, the recipe's cosine to 0.1 by step 20) at dp=2 with 20 warm-up
#    steps: onebit, topk (ratio 0.1) and powersgd (rank 2) end within 0.05 of the uncompressed loss (mean of
#    the last 20 steps), and the loss fell by more than 1 (without the warm-up onebit's gap
#    is 0.12: docs/COMPRESS.md);
#  - a save at step 3 and a resume give steps 4-6 bitwise (the residuals restored), for
#    onebit at dp=2 x pp=2 (each stage's own residual file, the tied wte in two), topk at dp=2 x tp=2 (one residual file per tp rank) and powersgd under zero = 2 (its
#    random Q is drawn from the step number);
#  - the metrics' compress_bytes match the formulas (onebit: sum of 4 + ceil(n/8) bytes
#    over the tensors; topk: 8 ceil(ratio n); powersgd: 4 r (rows + cols) per matrix where
#    smaller, else 4 n), 0 during the warm-up; grad_bytes = 4 x 34688;
#  - 1-bit Adam (momentum = true; compress_momentum.c): with topk ratio = 1 (nothing
#    dropped) the first 12 steps are within 1e-5 of uncompressed AdamW with the same frozen
#    variance (the exchange only rounds differently); onebit saves at step 3 and resumes
#    steps 4-6 bitwise (the momentum is AdamW's own state); refused with gradient
#    clipping, zero, sgd and powersgd (without a warm-up: measured once);
#  - canonical mode: onebit at dp = 1 and dp = 2 (also zero = 3) bitwise, a dp = 2 checkpoint resumed at
#    dp = 1 and dp = 4 bitwise, topk ratio = 1 bitwise uncompressed canonical mode;
#  - canonical mode with tp and pp: onebit tp=2 = dp=1, its checkpoint resumed at pp=2
#    bitwise; powersgd tp=2 = one rank; 1-bit Adam dp=2 = dp=1; topk 0.1 with an
#    interleaved pp=2 = one rank;
#  - expert parallelism (fast mode, the MoE test model): topk ratio = 1 at dp=2 ep=2,
#    dp=4 ep=2, pp=2 dp=2 ep=2 and tp=2 dp=2 ep=2 bitwise the uncompressed ep run; onebit, topk 0.1, powersgd with a 5-step
#    warm-up: the warm-up's bits, then not, the last-5 mean loss within 0.15 / 0.05 / 0.05;
#    the dense and expert bytes against the formulas; onebit resumed bitwise (the experts'
#    residuals saved by logical name), zero=1 its bits; refused: a resume at another ep,
#    canonical mode, zero=2, 1-bit Adam;
#  - refusals: a canonical checkpoint's residuals in
#    fast mode, dp = 1 (fast mode), rank with topk, ratio with onebit, another dp at
#    resume, a pp=2 checkpoint's residuals at pp=1; onebit at dp=2 x pp=2 tracks pp=1's.
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
recipe=$here/recipes/losses.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive   # several ranks share 2 cores: OpenMP must not spin
lines() { grep -E '^(LOSS|NORM) ' || true; }
run2() { "$loom" launch -n 2 "$recipe" threads=1 mesh.dp=2 comm_timeout=20 "$@"; }
onebit='strategy.compress={"onebit"}'

# --- the exchange is exact when nothing is dropped -----------------------------------
run2 | lines > "$tmp/dp"
run2 'strategy.compress={"topk",ratio=1}' | lines > "$tmp/all"
finite_losses "$tmp/dp" "$tmp/all"
cmp -s "$tmp/dp" "$tmp/all" || { echo "topk ratio=1 differs from plain dp"; paste "$tmp/dp" "$tmp/all" | head; exit 1; }
run2 strategy.zero=2 'strategy.compress={"topk",ratio=1}' | grep '^LOSS ' > "$tmp/all_z2"
cmp -s <(grep '^LOSS ' "$tmp/dp") "$tmp/all_z2" || { echo "zero=2 topk ratio=1 differs from plain dp"; exit 1; }
echo "ok topk ratio=1: losses and norms bitwise plain dp over 20 steps; with zero=2 the losses too"
# over the dp group only: with pp the same (dp=2 x pp=2, 1f1b)
runP() { "$loom" launch -n 4 "$recipe" threads=1 mesh.dp=2 mesh.pp=2 schedule=1f1b comm_timeout=20 "$@" | lines; }
runP > "$tmp/pp"
runP 'strategy.compress={"topk",ratio=1}' > "$tmp/pp_all"
finite_losses "$tmp/pp"
cmp -s "$tmp/pp" "$tmp/pp_all" || { echo "dp=2 x pp=2: topk ratio=1 differs from plain dp"; exit 1; }
echo "ok topk ratio=1 at dp=2 x pp=2: losses and norms bitwise plain dp x pp"

# --- onebit with ZeRO, and the same bits twice -----------------------------------------
run2 "$onebit" log.jsonl="$tmp/m.jsonl" | lines > "$tmp/ob"
run2 "$onebit" | lines > "$tmp/ob2"
finite_losses "$tmp/ob"
cmp -s "$tmp/ob" "$tmp/ob2" || { echo "onebit: two runs differ"; exit 1; }
for z in 1 2 3; do
  run2 strategy.zero=$z "$onebit" | lines > "$tmp/ob_z$z"
  d=$(max_loss_diff "$tmp/ob" "$tmp/ob_z$z")
  below "$d" 1e-6 || { echo "onebit zero=$z differs from onebit zero=0 by $d"; exit 1; }
done
echo "ok onebit: two runs bitwise; zero=1, 2, 3 within 1e-6 of zero=0's losses"

# --- bytes on the wire: the formulas over the tensors' sizes ---------------------------
# wte 256x32, wpe 32x32, per block ln1 w b, qkv w b, proj w b, ln2 w b, fc w b, fcproj w b, ln_f w b
sizes="8192 1024"; for b in 1 2; do sizes="$sizes 32 32 3072 96 1024 32 32 32 4096 128 4096 32"; done; sizes="$sizes 32 32"
want_ob=$(for n in $sizes; do echo "$n"; done | awk '{ s += 4 + int(($1 + 7) / 8) } END { print s }')
want_tk=$(for n in $sizes; do echo "$n"; done | awk '{ k = $1 * 0.1; c = int(k); if (c < k) c++; s += 8 * c } END { print s }')
got() { grep '"kind":"train"' "$1" | sed -n "$2p" | grep -o "\"$3\":[0-9.e+]*" | cut -d: -f2; }
[ "$(got "$tmp/m.jsonl" 5 compress_bytes)" = "$want_ob" ] || { echo "onebit compress_bytes $(got "$tmp/m.jsonl" 5 compress_bytes), formula $want_ob"; exit 1; }
[ "$(got "$tmp/m.jsonl" 5 grad_bytes)" = "$((4 * 34688))" ] || { echo "grad_bytes $(got "$tmp/m.jsonl" 5 grad_bytes)"; exit 1; }
run2 steps=4 'strategy.compress={"topk",ratio=0.1,warmup=2}' log.jsonl="$tmp/t.jsonl" > /dev/null
[ "$(got "$tmp/t.jsonl" 2 compress_bytes)" = 0 ] || { echo "topk warm-up step 2 sent compressed bytes"; exit 1; }
[ "$(got "$tmp/t.jsonl" 3 compress_bytes)" = "$want_tk" ] || { echo "topk compress_bytes $(got "$tmp/t.jsonl" 3 compress_bytes), formula $want_tk"; exit 1; }
# powersgd rank 2: a rows x cols tensor sends 4 r (rows + cols) bytes when that is smaller than
# itself, else whole; vectors whole (the same tensors as above, as rows:cols)
shapes="256:32 32:32"; for b in 1 2; do shapes="$shapes 32 32 96:32 3:32 32:32 32 32 32 128:32 128 32:128 32"; done; shapes="$shapes 32 32"
want_ps=$(for x in $shapes; do echo "$x"; done | awk -F: '{ if (NF == 1) { s += 4 * $1; next }
  a = 2 * ($1 + $2); s += 4 * (a < $1 * $2 ? a : $1 * $2) } END { print s }')
run2 steps=2 'strategy.compress={"powersgd",rank=2}' log.jsonl="$tmp/p.jsonl" > /dev/null
[ "$(got "$tmp/p.jsonl" 2 compress_bytes)" = "$want_ps" ] || { echo "powersgd compress_bytes $(got "$tmp/p.jsonl" 2 compress_bytes), formula $want_ps"; exit 1; }
echo "ok bytes per step: onebit $want_ob, topk 0.1 $want_tk (0 in the warm-up), powersgd rank 2 $want_ps, uncompressed $((4 * 34688))"

# --- 200 steps of SGD: compressed runs track the uncompressed loss ---------------------
sgd=(steps=200 'optimizer={"sgd",lr=1}')
tail_mean() { grep '^LOSS ' "$1" | tail -n 20 | awk '{ s += $4 } END { printf "%.4f", s / NR }'; }
run2 "${sgd[@]}" | lines > "$tmp/s0"
base=$(tail_mean "$tmp/s0")
for c in '{"onebit",warmup=20}' '{"topk",ratio=0.1,warmup=20}' '{"powersgd",rank=2,warmup=20}'; do
  run2 "${sgd[@]}" "strategy.compress=$c" | lines > "$tmp/s1"
  finite_losses "$tmp/s1"; fell=$(loss_fell "$tmp/s1" 1.0) || { echo "compress=$c: the loss did not fall by 1: $fell"; exit 1; }
  m=$(tail_mean "$tmp/s1")
  gap=$(awk -v a="$m" -v b="$base" 'BEGIN { d = a - b; printf "%.4f", d < 0 ? -d : d }')
  below "$gap" 0.05 || { echo "compress=$c: last-20 mean loss $m vs uncompressed $base (gap $gap)"; exit 1; }
  echo "ok compress=$c 200 SGD steps: last-20 mean loss $m vs uncompressed $base (gap $gap < 0.05; $fell), max |loss diff| $(max_loss_diff "$tmp/s0" "$tmp/s1")"
done

# --- 1-bit Adam: the momentum exchanged, AdamW's variance frozen after the warm-up ---------
adam=(grad_clip=0 'optimizer={"adamw",lr=1e-2}')
run2 grad_clip=0 'optimizer={"adamw",lr=1e-2,freeze_variance=5}' steps=12 | lines > "$tmp/fz"
run2 "${adam[@]}" steps=12 'strategy.compress={"topk",ratio=1,warmup=5,momentum=true}' | lines > "$tmp/fz_tk"
[ "$(grep -c '^LOSS' "$tmp/fz_tk")" -eq 12 ] || { echo "1-bit Adam (topk ratio=1): not 12 steps"; exit 1; }
d=$(max_loss_diff "$tmp/fz" "$tmp/fz_tk")
below "$d" 1e-5 || { echo "1-bit Adam with nothing dropped differs from frozen-variance AdamW by $d"; exit 1; }
ob='strategy.compress={"onebit",warmup=2,momentum=true}'
rm -rf "$tmp/ck"   # the uninterrupted run saves at step 3 itself
run2 "${adam[@]}" "$ob" steps=6 checkpoint.dir="$tmp/ck" checkpoint.every=3 | lines | awk '$2 > 3' > "$tmp/want"
run2 "${adam[@]}" "$ob" steps=6 resume="$tmp/ck/step_00000003" | lines > "$tmp/got"
[ "$(grep -c '^LOSS' "$tmp/got")" -eq 3 ] && cmp -s "$tmp/want" "$tmp/got" ||
  { echo "1-bit Adam: resumed steps 4-6 differ"; paste "$tmp/want" "$tmp/got"; exit 1; }
echo "ok 1-bit Adam: nothing dropped = frozen-variance AdamW within $d over 12 steps; onebit resumes steps 4-6 bitwise"

# --- resume restores the residuals: bitwise ------------------------------------------------
run4() { "$loom" launch -n 4 "$recipe" threads=1 mesh.dp=2 mesh.tp=2 comm_timeout=20 "$@"; }
runQ() { "$loom" launch -n 4 "$recipe" threads=1 mesh.dp=2 mesh.pp=2 schedule=1f1b comm_timeout=20 "$@"; }
# (each uninterrupted run saves at step 3 itself; pp's runs all 20 steps, for the pp=1
# comparison below, and its checkpoint is kept as $tmp/ckp)
for layout in "runQ strategy.compress={\"onebit\"}" "run4 strategy.compress={\"topk\",ratio=0.05} steps=6" "run2 strategy.zero=2 strategy.compress={\"powersgd\",rank=2} steps=6"; do
  rm -rf "$tmp/ck"
  $layout checkpoint.dir="$tmp/ck" checkpoint.every=3 | lines > "$tmp/full"; awk '$2 > 3 && $2 <= 6' "$tmp/full" > "$tmp/want"
  case $layout in runQ*) cp "$tmp/full" "$tmp/ob_pp"; rm -rf "$tmp/ckp"; cp -r "$tmp/ck" "$tmp/ckp";; esac
  grep -q '"compress": {"method": "'"$(echo "$layout" | grep -o 'onebit\|topk\|powersgd' | head -1)"'", "dp": 2}' \
    "$tmp/ck/step_00000003/manifest.json" || { echo "the manifest does not record the compression"; exit 1; }
  $layout steps=6 resume="$tmp/ck/step_00000003" | lines > "$tmp/got"
  [ "$(grep -c '^LOSS' "$tmp/got")" -eq 3 ] || { echo "$layout: expected steps 4-6"; exit 1; }
  cmp -s "$tmp/want" "$tmp/got" || { echo "$layout: resumed steps 4-6 differ"; paste "$tmp/want" "$tmp/got"; exit 1; }
  echo "ok ${layout#run? }: save at 3 + resume, steps 4-6 bitwise (residuals restored)"
done
# pp: each stage's residuals are its own (the tied wte's differ between the first and the
# last stage), so a pp=2 checkpoint resumes with compression only at pp=2
if run2 "$onebit" steps=6 resume="$tmp/ckp/step_00000003" > "$tmp/err" 2>&1; then
  echo "pp=1 resumed pp=2's residuals"; exit 1; fi
grep -q 'residuals of 2 pipeline stages; this run has 1' "$tmp/err" || { echo "unexpected message:"; cat "$tmp/err"; exit 1; }
echo "ok refused: a pp=2 checkpoint's residuals at pp=1"
# onebit at dp=2 x pp=2 (its 20 steps from the resume check above) tracks onebit at pp=1
# (the two stages' wte copies are compressed apart)
finite_losses "$tmp/ob_pp"
d=$(max_loss_diff "$tmp/ob" "$tmp/ob_pp")
below "$d" 0.05 || { echo "onebit dp=2 x pp=2 differs from onebit pp=1 by $d"; exit 1; }
echo "ok onebit at dp=2 x pp=2 within 0.05 of pp=1's losses over 20 steps (max diff $d)"
# a checkpoint's residuals are per dp rank: another dp is refused, naming both
if "$loom" launch -n 4 "$recipe" threads=1 mesh.dp=4 batch.micro=2 steps=6 "$onebit" \
    resume="$tmp/ck/step_00000003" > "$tmp/err" 2>&1; then echo "dp=4 resumed dp=2's residuals"; exit 1; fi
grep -q 'residuals of compress = "powersgd" at dp=2; this run compresses with "onebit" at dp=4' "$tmp/err" ||
  { echo "unexpected message:"; cat "$tmp/err"; exit 1; }

# --- canonical mode (docs/COMPRESS.md): a message and a residual per global micro-batch --
# onebit at dp=1, 2 and 4 gives the same bits; a dp=2 checkpoint resumes at dp=1 and dp=4
# bitwise (the residuals are keyed by micro-batch, not rank); topk with ratio = 1 gives
# uncompressed canonical mode's bits (the leaves' tree is canonical mode's)
can=(threads=1 deterministic=canonical batch.global=16)
"$loom" run "$recipe" "${can[@]}" steps=6 "$onebit" | lines > "$tmp/can1"
run2 "${can[@]}" steps=6 "$onebit" checkpoint.dir="$tmp/cck" checkpoint.every=3 | lines > "$tmp/can2"
finite_losses "$tmp/can1"
cmp -s "$tmp/can1" "$tmp/can2" || { echo "canonical onebit: dp=2 differs from dp=1"; paste "$tmp/can1" "$tmp/can2"; exit 1; }
"$loom" run "$recipe" "${can[@]}" steps=6 | lines > "$tmp/canu"
cmp -s "$tmp/can1" "$tmp/canu" && { echo "canonical onebit gave the uncompressed bits: nothing compressed"; exit 1; }
awk '$2 > 3' "$tmp/can1" > "$tmp/can_want"
"$loom" run "$recipe" "${can[@]}" steps=6 "$onebit" resume="$tmp/cck/step_00000003" | lines > "$tmp/can_r1"
"$loom" launch -n 4 "$recipe" "${can[@]}" mesh.dp=4 comm_timeout=30 steps=6 "$onebit" \
  resume="$tmp/cck/step_00000003" | lines > "$tmp/can_r4"
for f in can_r1 can_r4; do
  [ "$(grep -c '^LOSS' "$tmp/$f")" -eq 3 ] && cmp -s "$tmp/can_want" "$tmp/$f" ||
    { echo "canonical onebit: the dp=2 checkpoint resumed ($f) differs"; paste "$tmp/can_want" "$tmp/$f"; exit 1; }
done
run2 "${can[@]}" steps=6 'strategy.compress={"topk",ratio=1}' | lines > "$tmp/cank"
cmp -s "$tmp/canu" "$tmp/cank" || { echo "canonical topk ratio=1 differs from uncompressed canonical"; exit 1; }
run2 "${can[@]}" steps=6 "$onebit" strategy.zero=3 | lines > "$tmp/canz"
cmp -s "$tmp/can1" "$tmp/canz" || { echo "canonical onebit: dp=2 zero=3 differs from dp=1"; exit 1; }
echo "ok canonical compression: onebit dp=1 = dp=2 (also zero=3) bitwise over 6 steps (and not the uncompressed bits); a dp=2 checkpoint at 3 resumes at dp=1 and dp=4 bitwise; topk ratio=1 at dp=2 = uncompressed canonical dp=1"
# with tp and pp (the buckets are the logical tensors' canonical chunks; the last stage
# sends no tied wte): onebit at tp=2 = dp=1, its checkpoint at 3 resumed at pp=2 (1f1b)
# gives dp=1's steps 4-6; canonical powersgd (a leaf's own factors, summed in the tree) at
# tp=2 = one rank, and not the uncompressed bits; canonical 1-bit Adam (each leaf's share of
# the momentum is one of the global micro-batches') at dp=2 = one rank
run2 "${can[@]}" steps=6 mesh.dp=1 mesh.tp=2 "$onebit" checkpoint.dir="$tmp/tck" checkpoint.every=3 | lines > "$tmp/can_tp"
cmp -s "$tmp/can1" "$tmp/can_tp" || { echo "canonical onebit: tp=2 differs from dp=1"; paste "$tmp/can1" "$tmp/can_tp"; exit 1; }
run2 "${can[@]}" steps=6 mesh.dp=1 mesh.pp=2 schedule=1f1b "$onebit" resume="$tmp/tck/step_00000003" | lines > "$tmp/can_pp"
[ "$(grep -c '^LOSS' "$tmp/can_pp")" -eq 3 ] && cmp -s "$tmp/can_want" "$tmp/can_pp" ||
  { echo "canonical onebit: the tp=2 checkpoint resumed at pp=2 differs from dp=1"; paste "$tmp/can_want" "$tmp/can_pp"; exit 1; }
ps2='strategy.compress={"powersgd",rank=2}'
"$loom" run "$recipe" "${can[@]}" steps=6 "$ps2" | lines > "$tmp/can_ps1"
run2 "${can[@]}" steps=6 mesh.dp=1 mesh.tp=2 "$ps2" | lines > "$tmp/can_ps2"
finite_losses "$tmp/can_ps1"
cmp -s "$tmp/can_ps1" "$tmp/can_ps2" || { echo "canonical powersgd: tp=2 differs from one rank"; paste "$tmp/can_ps1" "$tmp/can_ps2"; exit 1; }
cmp -s "$tmp/can_ps1" "$tmp/canu" && { echo "canonical powersgd gave the uncompressed bits"; exit 1; }
ob1=(grad_clip=0 'optimizer={"adamw",lr=1e-2}' 'strategy.compress={"onebit",warmup=2,momentum=true}')
"$loom" run "$recipe" "${can[@]}" steps=6 "${ob1[@]}" | lines > "$tmp/can_a1"
run2 "${can[@]}" steps=6 "${ob1[@]}" | lines > "$tmp/can_a2"
finite_losses "$tmp/can_a1"
cmp -s "$tmp/can_a1" "$tmp/can_a2" || { echo "canonical 1-bit Adam: dp=2 differs from dp=1"; paste "$tmp/can_a1" "$tmp/can_a2"; exit 1; }
tk=('strategy.compress={"topk",ratio=0.1}' model.layers=4) # interleaved: each chunk's buckets as its backward ends
"$loom" run "$recipe" "${can[@]}" steps=6 "${tk[@]}" | lines > "$tmp/can_i1"
run2 "${can[@]}" steps=6 mesh.dp=1 mesh.pp=2 schedule=interleaved "${tk[@]}" | lines > "$tmp/can_i2"
finite_losses "$tmp/can_i1"
cmp -s "$tmp/can_i1" "$tmp/can_i2" || { echo "canonical topk 0.1: interleaved pp=2 differs from one rank"; paste "$tmp/can_i1" "$tmp/can_i2"; exit 1; }
echo "ok canonical compression with tp and pp: onebit tp=2 = dp=1 bitwise, its step-3 checkpoint resumed at pp=2 gives steps 4-6 bitwise; powersgd tp=2 = one rank (not uncompressed); 1-bit Adam dp=2 = dp=1; topk 0.1 interleaved pp=2 = one rank (4 layers)"

# --- refusals ----------------------------------------------------------------------------
refuse() { # what expected-text args...
  local what=$1 want=$2; shift 2
  if "$@" > "$tmp/err" 2>&1; then echo "$what: accepted"; exit 1; fi
  grep -q -- "$want" "$tmp/err" || { echo "$what: unexpected message:"; cat "$tmp/err"; exit 1; }
}
refuse canonical-fast-resume 'in canonical mode (one per global micro-batch); this run is in fast mode' \
  run2 batch.global=16 steps=6 "$onebit" resume="$tmp/cck/step_00000003"
refuse dp=1 'needs a data-parallel group of 2 or more ranks' "$loom" run "$recipe" steps=1 "$onebit"
refuse rank 'rank is for "powersgd"' run2 steps=1 'strategy.compress={"topk",rank=2}'
refuse ratio 'ratio is for "topk"' run2 steps=1 'strategy.compress={"onebit",ratio=0.5}'
# 1-bit Adam: the session refuses these before it needs the dp group, so one rank shows it
one=("$loom" run "$recipe" threads=1 steps=1)
refuse 1bit-adam-clip 'with grad_clip=1: the exchange forms the momentum' "${one[@]}" "$ob"
refuse 1bit-adam-zero 'with strategy.zero (each rank holds only its partition' "${one[@]}" \
  "${adam[@]}" strategy.zero=1 "$ob"
refuse 1bit-adam-sgd 'needs optimizer adamw' "${one[@]}" grad_clip=0 'optimizer={"sgd",lr=1}' "$ob"
refuse 1bit-adam-powersgd 'with onebit or topk, not powersgd' run2 steps=1 "${adam[@]}" \
  'strategy.compress={"powersgd",warmup=2,momentum=true}'
echo "ok refused: a canonical checkpoint's residuals in fast mode, dp=1 (fast mode), rank with topk, ratio with onebit, 1-bit Adam with grad_clip, zero, sgd or powersgd, another dp at resume"

# --- expert parallelism (fast mode; docs/COMPRESS.md "ep"): the dense entries compressed
# over dp, each rank's experts over its expert-data-parallel group (edp = dp / ep; at dp=2
# ep=2 edp is 1 and the experts are exchanged nowhere), one residual. The MoE test model
# (recipes/moe.lua: 2 blocks of 4 experts, AdamW, 20 steps), ep=2.
moe=$here/recipes/moe.lua
runE() { local n=$1; shift; "$loom" launch -n "$n" "$moe" threads=1 mesh.dp="$n" batch.global=$((4 * n)) \
  mesh.ep=2 comm_timeout=20 "$@" | grep '^LOSS ' || true; }
steps_are() { [ "$(grep -c '^LOSS' "$1")" -eq "$2" ] || { echo "$1: $(grep -c '^LOSS' "$1") steps, want $2"; exit 1; }; }
# nothing dropped (topk ratio = 1): the exchange is exact, the uncompressed ep run's bits
for n in 2 4; do
  runE $n > "$tmp/e$n"
  runE $n steps=6 'strategy.compress={"topk",ratio=1}' > "$tmp/e${n}k"
  finite_losses "$tmp/e$n"; steps_are "$tmp/e$n" 20; steps_are "$tmp/e${n}k" 6
  cmp -s <(head -6 "$tmp/e$n") "$tmp/e${n}k" || { echo "dp=$n ep=2: topk ratio=1 differs from uncompressed ep"; paste "$tmp/e$n" "$tmp/e${n}k"; exit 1; }
done
# with pp and tp beside ep (4 ranks, edp = 1): the same
for lay in "mesh.pp=2 schedule=1f1b" "mesh.tp=2"; do
  runE 4 mesh.dp=2 batch.global=8 steps=6 $lay > "$tmp/el"
  runE 4 mesh.dp=2 batch.global=8 steps=6 $lay 'strategy.compress={"topk",ratio=1}' > "$tmp/elk"
  finite_losses "$tmp/el"; steps_are "$tmp/el" 6
  cmp -s "$tmp/el" "$tmp/elk" || { echo "$lay dp=2 ep=2: topk ratio=1 differs from uncompressed ep"; exit 1; }
done
echo "ok dp=2 ep=2, dp=4 ep=2, pp=2 dp=2 ep=2 and tp=2 dp=2 ep=2: topk ratio=1 bitwise the uncompressed ep run (6 steps)"
# lossy: the warm-up's steps are the uncompressed bits, the next one is not (so compression
# is on, experts and all), and the last 5 steps' mean loss tracks the uncompressed run's
tail5() { tail -n 5 "$1" | awk '{ s += $4 } END { printf "%.4f", s / NR }'; }
for n in 2 4; do
  for c in '{"onebit",warmup=5}:0.15' '{"topk",ratio=0.1,warmup=5}:0.05' '{"powersgd",rank=2,warmup=5}:0.05'; do
    runE $n "strategy.compress=${c%:*}" log.jsonl="$tmp/e.jsonl" > "$tmp/ec"
    finite_losses "$tmp/ec"; steps_are "$tmp/ec" 20
    cmp -s <(head -6 "$tmp/e$n") <(head -6 "$tmp/ec") || { echo "dp=$n ep=2 ${c%:*}: the warm-up's steps 1-6 are not the uncompressed bits"; exit 1; }
    cmp -s <(sed -n 7p "$tmp/e$n") <(sed -n 7p "$tmp/ec") && { echo "dp=$n ep=2 ${c%:*}: step 7 is the uncompressed bits: nothing compressed"; exit 1; }
    gap=$(awk -v a="$(tail5 "$tmp/ec")" -v b="$(tail5 "$tmp/e$n")" 'BEGIN { d = a - b; printf "%.4f", d < 0 ? -d : d }')
    below "$gap" "${c#*:}" || { echo "dp=$n ep=2 ${c%:*}: last-5 mean loss $(tail5 "$tmp/ec") vs uncompressed $(tail5 "$tmp/e$n") (gap $gap)"; exit 1; }
    echo "ok dp=$n ep=2 ${c%:*}: steps 1-6 the uncompressed bits, step 7 not; last-5 mean loss $(tail5 "$tmp/ec") vs $(tail5 "$tmp/e$n") (gap $gap < ${c#*:})"
  done
done
# bytes (the last run: dp=4 ep=2 powersgd) and onebit's: the dense part's message over dp
# and the experts' over edp, each the formula over its tensors; 0 in the warm-up
dense="8192 1024"; for b in 1 2; do dense="$dense 32 32 3072 96 1024 32 32 32 128"; done; dense="$dense 32 32"
experts=""; for b in 1 2 3 4; do experts="$experts 4096 128 4096 32"; done # 2 blocks x 2 local experts
ob_bytes() { for x in $1; do echo "$x"; done | awk '{ s += 4 + int(($1 + 7) / 8) } END { print s }'; }
ps_bytes() { for x in $1; do echo "$x"; done | awk -F: '{ if (NF == 1) { s += 4 * $1; next }
  a = 2 * ($1 + $2); s += 4 * (a < $1 * $2 ? a : $1 * $2) } END { print s }'; }
want_pe=$(ps_bytes "$(for b in 1 2 3 4; do echo 128:32 128 32:128 32; done)")
[ "$(got "$tmp/e.jsonl" 5 compress_expert_bytes)" = 0 ] || { echo "powersgd: the warm-up's step 5 sent expert bytes"; exit 1; }
[ "$(got "$tmp/e.jsonl" 6 compress_expert_bytes)" = "$want_pe" ] || { echo "powersgd dp=4 ep=2: compress_expert_bytes $(got "$tmp/e.jsonl" 6 compress_expert_bytes), formula $want_pe"; exit 1; }
runE 4 steps=2 "$onebit" log.jsonl="$tmp/e.jsonl" > /dev/null
want_oe=$(ob_bytes "$experts"); want_od=$(ob_bytes "$dense")
[ "$(got "$tmp/e.jsonl" 2 compress_expert_bytes)" = "$want_oe" ] && [ "$(got "$tmp/e.jsonl" 2 compress_bytes)" = "$((want_od + want_oe))" ] ||
  { echo "onebit dp=4 ep=2: compress_bytes $(got "$tmp/e.jsonl" 2 compress_bytes) (formula $want_od + $want_oe), expert $(got "$tmp/e.jsonl" 2 compress_expert_bytes)"; exit 1; }
nx=$(for x in $experts; do echo "$x"; done | awk '{ s += $1 } END { print s }')
[ "$(got "$tmp/e.jsonl" 2 grad_expert_bytes)" = "$((4 * nx))" ] || { echo "grad_expert_bytes $(got "$tmp/e.jsonl" 2 grad_expert_bytes), want $((4 * nx))"; exit 1; }
echo "ok dp=4 ep=2 bytes a step: onebit $want_od dense + $want_oe expert, powersgd rank 2's expert part $want_pe (0 in the warm-up), against $((4 * nx)) expert bytes uncompressed"
# the residuals (dense and each rank's experts, saved by logical expert name) restored:
# onebit without a warm-up saved at step 3 resumes steps 4-6 bitwise; zero = 1 gives its bits
rm -rf "$tmp/cke"
runE 4 steps=6 "$onebit" checkpoint.dir="$tmp/cke" checkpoint.every=3 > "$tmp/eo"
steps_are "$tmp/eo" 6
cmp -s <(sed -n 2p "$tmp/e4") <(sed -n 2p "$tmp/eo") && { echo "onebit dp=4 ep=2 with no warm-up: step 2 is the uncompressed bits"; exit 1; }
grep -q '"compress": {"method": "onebit", "dp": 4, "ep": 2}' "$tmp/cke/step_00000003/manifest.json" ||
  { echo "the ep checkpoint's manifest does not record ep"; exit 1; }
runE 4 steps=6 "$onebit" resume="$tmp/cke/step_00000003" > "$tmp/eor"
steps_are "$tmp/eor" 3
cmp -s <(awk '$2 > 3' "$tmp/eo") "$tmp/eor" || { echo "onebit dp=4 ep=2: resumed steps 4-6 differ"; paste <(awk '$2 > 3' "$tmp/eo") "$tmp/eor"; exit 1; }
runE 4 steps=6 "$onebit" strategy.zero=1 > "$tmp/eoz"
cmp -s "$tmp/eo" "$tmp/eoz" || { echo "onebit dp=4 ep=2: zero=1 differs from zero=0"; exit 1; }
echo "ok onebit dp=4 ep=2: step 2 not the uncompressed bits; saved at 3, steps 4-6 resumed bitwise; zero=1 its bits"
refuse ep-resume 'compress = "onebit" at ep=2; this run compresses at ep=4' \
  "$loom" launch -n 4 "$moe" threads=1 mesh.dp=4 batch.global=16 mesh.ep=4 comm_timeout=20 steps=6 "$onebit" resume="$tmp/cke/step_00000003"
eref=("$loom" launch -n 2 "$moe" threads=1 mesh.dp=2 batch.global=8 mesh.ep=2 comm_timeout=20 steps=1)
refuse ep-canonical 'with deterministic = "canonical" and mesh.ep > 1 is not built yet' "${eref[@]}" deterministic=canonical "$onebit"
refuse ep-zero2 'with zero=2 and mesh.ep > 1 is not built yet' "${eref[@]}" strategy.zero=2 "$onebit"
refuse ep-1bit-adam 'momentum = true (1-bit Adam) with mesh.ep > 1 is not built yet' "${eref[@]}" grad_clip=0 \
  'strategy.compress={"onebit",warmup=2,momentum=true}'
echo "ok refused under ep: a resume at another ep, canonical mode, zero=2, 1-bit Adam"
