#!/usr/bin/env bash
# zero_pp.sh LOOM — ZeRO composed with pipeline parallelism (docs/ZERO.md, "With pipeline
# parallelism"): pp=2 x dp=2 on 4 ranks (loom launch, shm), the small model with 4 blocks,
# each stage's dp group partitioning that stage's parameter table:
#  - fast mode, 10 steps: zero=1 gives bitwise the losses, norms and validation loss of
#    plain pp=2 x dp=2, with 1f1b, zb1 and interleaved (the same all-reduce, the tied wte's
#    gradient exchanged before the step, an element-wise optimizer on both copies);
#  - fast mode, 10 steps: zero=2 (each micro-batch's backward reduce-scattered as it
#    reports its buckets, the last ones waited for at the next backward or before the
#    step: pp_trace.sh checks that; the tied wte's buckets after the wte exchange, the norm over partitions summed
#    over stages) within 1e-4 of plain pp x dp on the losses and 1e-5 relative on the
#    norms, 1f1b, zb1 and interleaved (2 chunks), one bucket and 0.01 MiB buckets;
#  - canonical mode: one rank and pp=2 x dp=2 with zero = 0, 1, 2 (1f1b; zero=1 also zb1)
#    give bitwise identical losses, norms and validation loss;
#  - per-rank bytes by category against the ZeRO formulas applied to the rank's stage,
#    Ψ_stage from the model's shape, within 1% (the two stages' Ψ differ by 2.9%);
#  - zero=3 (each stage gathering its own units around every micro-batch's forward and
#    backward, released after, the next hinted by the engine): fast mode within 1e-4 of plain
#    pp x dp with 1f1b and zb1; canonical mode bitwise one rank; per-rank bytes 16Ψ_stage/N.
#  - bf16 with the fp32 master partitioned (zero_master.c), zero=1, 4 steps: bitwise the
#    same layout with LOOM_ZERO_MASTER=whole, also saved at step 2 and resumed; canonical
#    mode bitwise one rank.
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
recipe=$here/recipes/pp_probe.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive   # several ranks share 2 cores: OpenMP must not spin
model="model.heads=4 model.layers=4 steps=10 threads=1"
keep() { grep -E '^(LOSS|NORM|VAL) ' || true; }
run1() { "$loom" run "$recipe" $model "$@" | keep; }
ppdp() { "$loom" launch -n 4 "$recipe" $model comm_timeout=20 mesh.pp=2 mesh.dp=2 microbatches=2 "$@" | keep; }
# rel_norm_diff A B: the largest relative difference of the NORM lines, as %.3g
rel_norm_diff() {
  paste <(grep '^NORM' "$1") <(grep '^NORM' "$2") |
    awk '{ d = ($4 - $8) / $4; if (d < 0) d = -d; if (d > m) m = d } END { printf "%.3g", m + 0 }'
}
same() { # same NAME A B: 10 steps in both, bitwise identical
  [ "$(grep -c '^LOSS' "$2")" -eq 10 ] && [ "$(grep -c '^LOSS' "$3")" -eq 10 ] ||
    { echo "$1: expected 10 steps"; cat "$2" "$3"; exit 1; }
  finite_losses "$2" "$3"
  cmp -s "$2" "$3" || { echo "$1 differ"; paste "$2" "$3" | head; exit 1; }
}

# --- fast mode: zero=1 against plain pp x dp --------------------------------------------
for sched in 1f1b zb1 interleaved; do
  ppdp schedule=$sched > "$tmp/plain"; cp "$tmp/plain" "$tmp/plain_$sched"   # kept for zero=3 below
  ppdp schedule=$sched strategy.zero=1 > "$tmp/z1"
  same "fast pp=2 x dp=2 $sched: zero=1 and plain" "$tmp/plain" "$tmp/z1"
  echo "ok fast pp=2 x dp=2 $sched zero=1: losses, norms and validation loss bitwise those of plain pp x dp over 10 steps"
  for bucket in "" "strategy.dp.bucket_mb=0.01"; do
    ppdp schedule=$sched strategy.zero=2 $bucket > "$tmp/z2"
    [ "$(grep -c '^LOSS' "$tmp/z2")" -eq 10 ] || { echo "zero=2 $sched: expected 10 steps"; cat "$tmp/z2"; exit 1; }
    d=$(max_loss_diff "$tmp/plain" "$tmp/z2"); nd=$(rel_norm_diff "$tmp/plain" "$tmp/z2")
    below "$d" 1e-4 || { echo "zero=2 $sched ${bucket:-one bucket} differs from plain pp x dp by $d"; exit 1; }
    below "$nd" 1e-5 || { echo "zero=2 $sched ${bucket:-one bucket}: norms differ from plain pp x dp by $nd (relative)"; exit 1; }
    echo "ok fast pp=2 x dp=2 $sched zero=2 ${bucket:-(one bucket)}: max |loss diff| vs plain pp x dp $d, norm rel diff $nd over 10 steps"
  done
done

# --- fast mode: zero=3 against plain pp x dp (the plain 1f1b and zb1 runs above) ----------
for sched in 1f1b zb1; do
  cp "$tmp/plain_$sched" "$tmp/plain"
  ppdp schedule=$sched strategy.zero=3 > "$tmp/z3"
  [ "$(grep -c '^LOSS' "$tmp/z3")" -eq 10 ] || { echo "zero=3 $sched: expected 10 steps"; cat "$tmp/z3"; exit 1; }
  d=$(max_loss_diff "$tmp/plain" "$tmp/z3"); nd=$(rel_norm_diff "$tmp/plain" "$tmp/z3")
  below "$d" 1e-4 || { echo "zero=3 $sched differs from plain pp x dp by $d"; exit 1; }
  below "$nd" 1e-5 || { echo "zero=3 $sched: norms differ from plain pp x dp by $nd (relative)"; exit 1; }
  vd=$(paste <(grep '^VAL' "$tmp/plain") <(grep '^VAL' "$tmp/z3") | awk 'NF == 6 { d = $3 - $6; printf "%.3g", d < 0 ? -d : d }')
  finite "$vd"
  below "$vd" 1e-4 || { echo "zero=3 $sched: validation loss differs by $vd"; exit 1; }
  echo "ok fast pp=2 x dp=2 $sched zero=3: max |loss diff| vs plain pp x dp $d, norm rel diff $nd, validation $vd over 10 steps"
done

# --- canonical mode: bitwise one rank, across zero 0..3 under pp --------------------------
c="deterministic=canonical"
run1 $c batch.global=16 > "$tmp/c1"
for z in 0 1 2 3; do
  ppdp $c strategy.zero=$z > "$tmp/cz"
  same "canonical pp=2 x dp=2 zero=$z and one rank" "$tmp/c1" "$tmp/cz"
done
ppdp $c strategy.zero=3 schedule=zb1 > "$tmp/cz"
same "canonical pp=2 x dp=2 zb1 zero=3 and one rank" "$tmp/c1" "$tmp/cz"
echo "ok canonical: one rank and pp=2 x dp=2 with zero 0, 1, 2, 3 (and zb1 zero=3) bitwise identical over 10 steps"

# bf16 with the fp32 master partitioned (zero_master.c): each stage's dp group partitions
# its own table's master; 4 steps bitwise the same layout with the master whole
# (LOOM_ZERO_MASTER=whole), saved at step 2 and resumed (steps 3-4 and the validation loss
# bitwise the whole master's), and in canonical mode bitwise one rank
b16="precision=bf16 steps=4 strategy.zero=1"
steps34() { grep -E '^(LOSS|NORM) [34] |^VAL ' "$1"; }
ppdp $b16 checkpoint.dir="$tmp/bck" checkpoint.every=2 > "$tmp/bp"   # saved at step 2 too
LOOM_ZERO_MASTER=whole ppdp $b16 > "$tmp/bw"
[ "$(grep -c '^LOSS' "$tmp/bp")" -eq 4 ] || { echo "bf16 pp=2 x dp=2 zero=1: expected 4 steps"; cat "$tmp/bp"; exit 1; }
finite_losses "$tmp/bw" "$tmp/bp"
cmp -s "$tmp/bw" "$tmp/bp" || { echo "bf16 pp=2 x dp=2 zero=1: the partitioned master differs from the whole one"; paste "$tmp/bw" "$tmp/bp"; exit 1; }
ppdp $b16 resume="$tmp/bck/step_00000002" > "$tmp/br"
[ "$(grep -c '^LOSS' "$tmp/br")" -eq 2 ] || { echo "bf16 pp=2 x dp=2 zero=1: the resumed run did not give steps 3-4"; cat "$tmp/br"; exit 1; }
cmp -s <(steps34 "$tmp/bw") <(steps34 "$tmp/br") || { echo "bf16 pp=2 x dp=2 zero=1: resumed at step 2, steps 3-4 differ from the uninterrupted whole master's"; paste <(steps34 "$tmp/bw") <(steps34 "$tmp/br"); exit 1; }
run1 $c batch.global=16 $b16 > "$tmp/bc1"
ppdp $c $b16 > "$tmp/bcz"
finite_losses "$tmp/bc1"
cmp -s "$tmp/bc1" "$tmp/bcz" || { echo "canonical bf16 pp=2 x dp=2 zero=1 differs from one rank"; paste "$tmp/bc1" "$tmp/bcz"; exit 1; }
echo "ok bf16 pp=2 x dp=2 zero=1 with the fp32 master partitioned: 4 steps and a save at step 2 resumed bitwise the whole master's, canonical bitwise one rank"

# --- memory by category against the formulas, per stage -----------------------------------
# Ψ_stage from the model's shape (common.lua: V=256, ctx=32, C=32; 2 blocks of 12C^2 + 13C
# per stage): stage 0 holds wte, wpe and its blocks, the last stage its blocks, ln_f, wte.
blk=$((12 * 32 * 32 + 13 * 32))
psi0=$((256 * 32 + 32 * 32 + 2 * blk)) psi1=$((2 * blk + 2 * 32 + 256 * 32))
for z in 0 1 2 3; do
  "$loom" launch -n 4 "$here/recipes/zero_memory.lua" model.heads=4 model.layers=4 mesh.pp=2 \
    mesh.dp=2 microbatches=2 strategy.zero=$z | sed 's/^\[rank [0-9]*\] //' | grep -a '^MEM ' > "$tmp/mem" || true
  awk -v psi0=$psi0 -v psi1=$psi1 -v n=2 -v z=$z '
    function near(got, want) { r = got / want; return r > 0.99 && r < 1.01 }
    { p = $3; g = $4; o = $5; m = $6; ms = p + g + o + m
      s = -1
      for (k = 0; k < 2; k++) { psi = k ? psi1 : psi0
        want = z == 0 ? 16 * psi : z == 1 ? 8 * psi + 8 * psi / n : z == 2 ? 4 * psi + 12 * psi / n : 16 * psi / n
        if (near(p, z == 3 ? 4 * psi / n : 4 * psi) && near(g, z >= 2 ? 4 * psi / n : 4 * psi) &&
            near(o, z ? 8 * psi / n : 8 * psi) &&
            m == 0 && near(ms, want)) s = k }
      if (s < 0) { printf "rank %d zero=%d: params %d grads %d optimizer %d master %d fit neither stage (Ψ %d, %d)\n", $2, z, p, g, o, m, psi0, psi1; bad = 1 }
      else { count[s]++; got[s] = ms } }
    END {
      if (count[0] != 2 || count[1] != 2) { printf "zero=%d: %d ranks fit stage 0, %d stage 1 (2 each expected)\n", z, count[0], count[1]; bad = 1 }
      if (bad) exit 1
      printf "ok memory pp=2 x dp=2 zero=%d: model states per rank %d (stage 0, Ψ=%d) and %d (stage 1, Ψ=%d) bytes, formula %s\n", z, got[0], psi0, got[1], psi1, z == 0 ? "16Ψ" : z == 1 ? "8Ψ + 8Ψ/2" : z == 2 ? "4Ψ + 12Ψ/2" : "16Ψ/2"
    }' "$tmp/mem"
done
