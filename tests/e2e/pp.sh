#!/usr/bin/env bash
# pp.sh LOOM — pipeline parallelism on one node (loom launch, shm), fast mode (fp32):
#  - pp=2 with gpipe, 1f1b, interleaved (2 chunks) and zb1, pp=4 with gpipe, 1f1b and zb1,
#    pp=4 interleaved on an 8-block model, pp=2 interleaved with activations as large as
#    shm's mailbox (2 steps), an explicit pp_layers split, pp=2 x dp=2,
#    pp=2 x tp=2 (both also with zb1), pp=2 x tp=2 with sequence parallelism and
#    pp=2 x tp=2 x dp=2 (8 ranks) train
#    the same losses as one rank with the same global batch (micro x microbatches x dp)
#    within 2e-5 over 10 steps, the gradient norms within 1e-5 relative and the validation
#    loss (eval through the pipeline) within 2e-5; only summation order differs (the tied
#    wte's two gradient halves, the norm's per-stage parts);
#  - the same pipeline layout twice is bitwise identical, and zb1 (B, then W: the split
#    backward) is bitwise 1f1b (every gradient summed over micro-batches in the same order);
#  - per-rank parameter bytes drop: each stage holds less than one rank, and the stages
#    together hold one rank's parameters plus the second copy of the tied wte, exactly;
#  - the engine's count of micro-batches in flight: 1f1b holds pp on stage 0 and 1 on the
#    last stage, gpipe all m, zb1 pp on every stage (a micro-batch is held until its W);
#  - non-finite gradients (lr = 1e30) skip the same steps on every stage as on one rank;
#  - canonical mode: pp=1, 2, 4 with gpipe, 1f1b, zb1 and interleaved, an uneven pp_layers
#    split, the default split weighing a large LM head (3 + 1 blocks), pp=2 x dp=2,
#    pp=2 x tp=2 (also with zb1 and interleaved), pp=2 x tp=2 with sequence parallelism
#    (1f1b and interleaved), pp=2 x tp=2 x dp=2,
#    pp=4 interleaved on 8 blocks and pp=2 with 3 uneven chunks give bitwise-identical
#    losses, gradient norms and validation loss;
#  - what pipeline parallelism refuses is refused with a message naming it.
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
recipe=$here/recipes/pp_probe.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive   # several ranks share 2 cores: OpenMP must not spin
model="model.heads=4 model.layers=4 steps=10 threads=1"
keep() { grep -E '^(LOSS|NORM|VAL|PEAK|SKIP|PARAMBYTES|\[rank [0-9]+\] (PEAK|SKIP|PARAMBYTES))' || true; }
run1() { "$loom" run "$recipe" $model "$@" | keep; }
runN() { local n=$1; shift; "$loom" launch -n "$n" "$recipe" $model comm_timeout=20 "$@" | keep; }
# rel_norm_diff A B: the largest relative difference of the NORM lines, as %.3g
rel_norm_diff() {
  paste <(grep '^NORM' "$1") <(grep '^NORM' "$2") |
    awk '{ d = ($4 - $8) / $4; if (d < 0) d = -d; if (d > m) m = d } END { printf "%.3g", m + 0 }'
}
val_diff() {
  paste <(grep '^VAL' "$1") <(grep '^VAL' "$2") |
    awk '{ d = $3 - $6; if (d < 0) d = -d; printf "%.3g", d }'
}
check_close() { # name file reference
  [ "$(grep -c '^LOSS' "$2")" -eq 10 ] || { echo "$1: expected 10 steps"; cat "$2"; exit 1; }
  local d n v
  d=$(max_loss_diff "$3" "$2"); n=$(rel_norm_diff "$3" "$2"); v=$(val_diff "$3" "$2")
  below "$d" 2e-5 || { echo "$1: losses differ from one rank by $d"; paste "$3" "$2" | head; exit 1; }
  below "$n" 1e-5 || { echo "$1: gradient norms differ from one rank by $n (relative)"; exit 1; }
  below "$v" 2e-5 || { echo "$1: validation loss differs from one rank by $v"; exit 1; }
  echo "ok $1 vs one rank: max |loss diff| $d over 10 steps, norm rel diff $n, val diff $v"
}

run1 batch.global=16 > "$tmp/one"
for layout in "2 mesh.pp=2 schedule=gpipe" "2 mesh.pp=2 schedule=1f1b" \
              "2 mesh.pp=2 schedule=interleaved" "4 mesh.pp=4 schedule=gpipe" \
              "4 mesh.pp=4 schedule=1f1b" "2 mesh.pp=2 pp_layers={1,3}" \
              "2 mesh.pp=2 schedule=zb1" "4 mesh.pp=4 schedule=zb1"; do
  runN ${layout%% *} microbatches=4 ${layout#* } > "$tmp/pp"
  check_close "${layout#* } (4 micro-batches)" "$tmp/pp" "$tmp/one"
  # kept for the checks below: pp=2 and pp=4 1f1b (twice, parameter bytes), pp=4 zb1
  case "${layout#* }" in "mesh.pp=2 schedule=1f1b") cp "$tmp/pp" "$tmp/pp2_1f1b" ;;
    "mesh.pp=4 schedule=1f1b") cp "$tmp/pp" "$tmp/pp4_1f1b" ;; "mesh.pp=4 schedule=zb1") cp "$tmp/pp" "$tmp/pp4_zb1" ;; esac
done
runN 4 mesh.pp=2 mesh.dp=2 microbatches=2 > "$tmp/ppdp"
check_close "mesh.pp=2 x mesh.dp=2 (2 micro-batches each)" "$tmp/ppdp" "$tmp/one"
runN 4 mesh.pp=2 mesh.dp=2 schedule=zb1 microbatches=2 > "$tmp/ppdpz"
check_close "mesh.pp=2 x mesh.dp=2 schedule=zb1 (2 micro-batches each)" "$tmp/ppdpz" "$tmp/one"
runN 4 mesh.pp=2 mesh.tp=2 microbatches=4 > "$tmp/pptp"
check_close "mesh.pp=2 x mesh.tp=2 (4 micro-batches)" "$tmp/pptp" "$tmp/one"
runN 8 mesh.pp=2 mesh.tp=2 mesh.dp=2 microbatches=2 > "$tmp/pptpdp"
check_close "mesh.pp=2 x mesh.tp=2 x mesh.dp=2, 8 ranks (2 micro-batches each)" "$tmp/pptpdp" "$tmp/one"
runN 4 mesh.pp=2 mesh.tp=2 schedule=zb1 microbatches=4 > "$tmp/pptpz"
check_close "mesh.pp=2 x mesh.tp=2 schedule=zb1 (4 micro-batches)" "$tmp/pptpz" "$tmp/one"
# Sequence parallelism inside each stage: each tp rank sends its shard of the rows to the
# same tp rank of the next stage. batch.micro=1: a micro-batch's 32 rows split 16 + 16, so
# tp rank 1 holds positions 16..31 (with whole sequences per shard a wrong row offset
# would not show).
run1 batch.micro=1 batch.global=4 > "$tmp/one_m1"
runN 4 mesh.pp=2 mesh.tp=2 tp_sequence_parallel=true batch.micro=1 microbatches=4 > "$tmp/pptpsp"
check_close "mesh.pp=2 x mesh.tp=2 tp_sequence_parallel=true (4 micro-batches of 1)" "$tmp/pptpsp" "$tmp/one_m1"
run1 model.layers=8 batch.global=16 > "$tmp/one8"
runN 4 model.layers=8 mesh.pp=4 schedule=interleaved microbatches=4 > "$tmp/pp4i"
check_close "mesh.pp=4 schedule=interleaved, 8 blocks in 8 virtual stages" "$tmp/pp4i" "$tmp/one8"
# Activations as large as shm's mailbox (8 x 32 x 128 floats = its default 131072 bytes):
# interleaved pp=2 deadlocked here while a receive's wait also waited for the rank's earlier
# sends (each rank's last send then waited for the other's next receive).
big="model.dim=128 batch.micro=8 steps=2"
run1 $big batch.global=32 > "$tmp/oneb"
runN 2 $big mesh.pp=2 schedule=interleaved microbatches=4 comm_timeout=5 > "$tmp/ppb"
[ "$(grep -c '^LOSS' "$tmp/ppb")" -eq 2 ] || { echo "interleaved, mailbox-sized activations: expected 2 steps"; cat "$tmp/ppb"; exit 1; }
d=$(max_loss_diff "$tmp/oneb" "$tmp/ppb")
below "$d" 2e-5 || { echo "interleaved, mailbox-sized activations: losses differ from one rank by $d"; exit 1; }
echo "ok mesh.pp=2 schedule=interleaved with 131072-byte activations (shm's mailbox): trains, max |loss diff| $d vs one rank"

# the loop's pp=4 1f1b and zb1 runs above against one more 1f1b run
grep -E '^(LOSS|NORM)' "$tmp/pp4_1f1b" > "$tmp/a"
runN 4 mesh.pp=4 schedule=1f1b microbatches=4 | grep -E '^(LOSS|NORM)' > "$tmp/b"
cmp -s "$tmp/a" "$tmp/b" || { echo "pp=4 1f1b twice differs"; paste "$tmp/a" "$tmp/b" | head; exit 1; }
echo "ok pp=4 1f1b run twice: losses and gradient norms bitwise identical"
grep -E '^(LOSS|NORM)' "$tmp/pp4_zb1" > "$tmp/z"
cmp -s "$tmp/a" "$tmp/z" || { echo "pp=4 zb1 differs from 1f1b"; paste "$tmp/a" "$tmp/z" | head; exit 1; }
echo "ok pp=4 zb1 (B, then W) and 1f1b: losses and gradient norms bitwise identical"

# Parameter bytes: wte (256 x 32 floats) sits on the first and the last stage (every
# rank's PARAMBYTES line of the loop's pp=2 and pp=4 1f1b runs).
one=$(awk '/^PARAMBYTES/ { print $3 }' "$tmp/one")
wte=$((256 * 32 * 4))
for n in 2 4; do
  cp "$tmp/pp${n}_1f1b" "$tmp/bytes"
  sum=0; count=0
  for b in $(grep -oE 'PARAMBYTES [0-9]+ [0-9]+' "$tmp/bytes" | awk '{ print $3 }'); do
    [ "$b" -lt "$one" ] || { echo "pp=$n: a stage holds $b parameter bytes, one rank $one"; exit 1; }
    sum=$((sum + b)); count=$((count + 1))
  done
  [ "$count" -eq "$n" ] || { echo "pp=$n: $count PARAMBYTES lines"; exit 1; }
  [ "$sum" -eq $((one + wte)) ] || { echo "pp=$n: stages hold $sum bytes, want $one + $wte (tied wte twice)"; exit 1; }
  echo "ok pp=$n parameter bytes: $(grep -oE 'PARAMBYTES [0-9]+ [0-9]+' "$tmp/bytes" | awk '{ printf "%s ", $3 }')(one rank $one; together one rank + one wte)"
done

# Micro-batches in flight (the engine's count, per rank): pp=4, m=8.
peak() { grep -E "^$1PEAK 2 " "$2" | awk '{ print $NF }'; }
runN 4 mesh.pp=4 schedule=1f1b microbatches=8 steps=2 > "$tmp/p1"
runN 4 mesh.pp=4 schedule=gpipe microbatches=8 steps=2 > "$tmp/pg"
[ "$(peak '' "$tmp/p1")" = 4 ] || { echo "1f1b pp=4 m=8: stage 0 held $(peak '' "$tmp/p1") micro-batches, want 4"; exit 1; }
[ "$(peak '\[rank 3\] ' "$tmp/p1")" = 1 ] || { echo "1f1b pp=4 m=8: the last stage held $(peak '\[rank 3\] ' "$tmp/p1"), want 1"; exit 1; }
[ "$(peak '' "$tmp/pg")" = 8 ] || { echo "gpipe pp=4 m=8: stage 0 held $(peak '' "$tmp/pg") micro-batches, want 8"; exit 1; }
runN 4 mesh.pp=4 schedule=zb1 microbatches=8 steps=2 > "$tmp/pz"
for r in 0 1 2 3; do
  if [ $r = 0 ]; then p=$(peak '' "$tmp/pz"); else p=$(peak "\\[rank $r\\] " "$tmp/pz"); fi
  [ "$p" = 4 ] || { echo "zb1 pp=4 m=8: stage $r held '$p' micro-batches, want 4 (p: until each W)"; exit 1; }
done
echo "ok in flight at pp=4, m=8: 1f1b stage 0 holds 4, the last stage 1; gpipe stage 0 holds 8; zb1 every stage 4"

# The non-finite check spans the stages: lr = 1e30 blows the weights up after step 1, so
# later gradients are not finite; every rank skips exactly the steps one rank skips.
run1 batch.global=16 optimizer.lr=1e30 steps=4 | grep '^SKIP' > "$tmp/s1"
grep -q 'SKIP 4 true' "$tmp/s1" || { echo "one rank with lr=1e30 did not skip step 4"; cat "$tmp/s1"; exit 1; }
runN 4 mesh.pp=4 microbatches=4 optimizer.lr=1e30 steps=4 | grep 'SKIP' > "$tmp/s4"
for r in 0 1 2 3; do
  if [ $r = 0 ]; then grep '^SKIP' "$tmp/s4"; else grep "^\[rank $r\] SKIP" "$tmp/s4" | sed 's/^\[rank [0-9]*\] //'; fi > "$tmp/sr"
  cmp -s "$tmp/s1" "$tmp/sr" || { echo "pp=4 rank $r skipped other steps than one rank"; paste "$tmp/s1" "$tmp/sr"; exit 1; }
done
echo "ok non-finite gradients at pp=4: every rank skips the steps one rank skips ($(grep -c true "$tmp/s1") of 4)"

# Canonical mode: pp=1, 2 and 4, gpipe and 1f1b, an uneven split, with dp and with tp:
# the same bits (losses, gradient norms, validation loss).
canon="deterministic=canonical steps=6"
run1 $canon batch.global=16 | grep -E '^(LOSS|NORM|VAL)' > "$tmp/c1"
for layout in "2 mesh.pp=2 schedule=1f1b microbatches=4" "2 mesh.pp=2 schedule=gpipe microbatches=4" \
              "4 mesh.pp=4 schedule=1f1b microbatches=4" "4 mesh.pp=4 schedule=gpipe microbatches=4" \
              "2 mesh.pp=2 pp_layers={3,1} microbatches=4" "4 mesh.pp=2 mesh.dp=2 microbatches=2" \
              "4 mesh.pp=2 mesh.tp=2 microbatches=4" "2 mesh.pp=2 schedule=zb1 microbatches=4" \
              "4 mesh.pp=4 schedule=zb1 microbatches=4" "4 mesh.pp=2 mesh.dp=2 schedule=zb1 microbatches=2" \
              "4 mesh.pp=2 mesh.tp=2 schedule=zb1 microbatches=4" \
              "8 mesh.pp=2 mesh.tp=2 mesh.dp=2 microbatches=2"; do
  runN ${layout%% *} $canon ${layout#* } | grep -E '^(LOSS|NORM|VAL)' > "$tmp/c"
  cmp -s "$tmp/c1" "$tmp/c" || { echo "canonical ${layout#* } differs from one rank"; paste "$tmp/c1" "$tmp/c" | head; exit 1; }
  echo "ok canonical ${layout#* }: losses, gradient norms and val loss bitwise those of one rank"
done
# Interleaved: each chunk's parameters in trees of their own, the tied wte's halves added
# after the step's list, the norm in virtual-stage order (one rank's).
for layout in "2 mesh.pp=2 schedule=interleaved microbatches=4" \
              "4 mesh.pp=2 mesh.dp=2 schedule=interleaved microbatches=2" \
              "4 mesh.pp=2 mesh.tp=2 schedule=interleaved microbatches=4"; do
  runN ${layout%% *} $canon ${layout#* } | grep -E '^(LOSS|NORM|VAL)' > "$tmp/c"
  cmp -s "$tmp/c1" "$tmp/c" || { echo "canonical ${layout#* } differs from one rank"; paste "$tmp/c1" "$tmp/c" | head; exit 1; }
  echo "ok canonical ${layout#* }: losses, gradient norms and val loss bitwise those of one rank"
done
# Sequence parallelism inside each stage (micro-batches of 1 sequence: see above).
run1 $canon batch.micro=1 batch.global=4 | grep -E '^(LOSS|NORM|VAL)' > "$tmp/c1m1"
for layout in "4 mesh.pp=2 mesh.tp=2 tp_sequence_parallel=true microbatches=4" \
              "4 mesh.pp=2 mesh.tp=2 tp_sequence_parallel=true schedule=interleaved microbatches=4"; do
  runN ${layout%% *} $canon batch.micro=1 ${layout#* } | grep -E '^(LOSS|NORM|VAL)' > "$tmp/c"
  cmp -s "$tmp/c1m1" "$tmp/c" || { echo "canonical ${layout#* } differs from one rank"; paste "$tmp/c1m1" "$tmp/c" | head; exit 1; }
  echo "ok canonical ${layout#* } (micro 1): losses, gradient norms and val loss bitwise those of one rank"
done
# The default split weighs the LM head by its FLOPs: padded to 1024 rows it costs 2.3
# blocks, so 4 blocks split 3 + 1 (even would be 2 + 2); canonical mode stays bitwise.
run1 $canon model.vocab_padded=1024 batch.global=16 steps=3 | grep -E '^(LOSS|NORM|VAL)' > "$tmp/cv"
"$loom" launch -n 2 "$recipe" $model comm_timeout=20 $canon model.vocab_padded=1024 steps=3 \
  mesh.pp=2 microbatches=4 > "$tmp/cvo"
grep -q 'x2 pp (1f1b, blocks 3+1)' "$tmp/cvo" || { echo "vocab_padded=1024: not split 3+1"; grep ' pp (' "$tmp/cvo"; exit 1; }
grep -E '^(LOSS|NORM|VAL)' "$tmp/cvo" > "$tmp/cvp"
cmp -s "$tmp/cv" "$tmp/cvp" || { echo "canonical, split 3+1 by cost, differs from one rank"; paste "$tmp/cv" "$tmp/cvp" | head; exit 1; }
echo "ok canonical mesh.pp=2 with the head weighed (vocab_padded=1024: blocks 3+1): bitwise one rank"
run1 $canon model.layers=8 batch.global=16 | grep -E '^(LOSS|NORM|VAL)' > "$tmp/c8"
for layout in "4 mesh.pp=4 schedule=interleaved microbatches=4" \
              "2 mesh.pp=2 schedule=interleaved pp_chunks=3 pp_layers={1,2,1,1,2,1} microbatches=4"; do
  runN ${layout%% *} $canon model.layers=8 ${layout#* } | grep -E '^(LOSS|NORM|VAL)' > "$tmp/c"
  cmp -s "$tmp/c8" "$tmp/c" || { echo "canonical ${layout#* } (8 blocks) differs from one rank"; paste "$tmp/c8" "$tmp/c" | head; exit 1; }
  echo "ok canonical ${layout#* }, 8 blocks: losses, gradient norms and val loss bitwise those of one rank"
done

# Refusals, each with its message.
refused() { # expected-text args...
  local want=$1; shift
  if "$loom" launch "$@" > "$tmp/err" 2>&1; then echo "accepted: $*"; exit 1; fi
  grep -qF -- "$want" "$tmp/err" || { echo "refusal of '$*' lacks '$want':"; cat "$tmp/err"; exit 1; }
  echo "ok refused ($want)"
}
base="$recipe $model comm_timeout=20"
refused 'pp_layers adds up to 3 blocks, but the model has layers=4' -n 2 $base mesh.pp=2 'pp_layers={1,2}'
refused 'pp_layers has 3 entries; it needs one per stage, pp = 2 (2)' -n 2 $base mesh.pp=2 'pp_layers={1,2,1}'
refused 'not a multiple of stages' -n 4 $base mesh.pp=4 schedule=interleaved model.layers=8 microbatches=6
refused 'cannot give each of the 8 pipeline stages a block' -n 4 $base mesh.pp=4 schedule=interleaved microbatches=4
refused 'the split backward does not run under sequence parallelism yet' -n 4 $base mesh.pp=2 mesh.tp=2 tp_sequence_parallel=true schedule=zb1
refused 'sets up the pipeline, and this run has no pipeline (mesh.pp = 1)' -n 1 $base microbatches=4
refused 'but batch.micro x microbatches x dp = 4 x 4 x 1 = 16' -n 2 $base mesh.pp=2 microbatches=4 batch.global=8
