#!/usr/bin/env bash
# norms.sh LOOM — the global gradient norm and grad_clip under every layout, where tp.sh,
# dp.sh and pp.sh leave a gap (pp.sh compares pp's norms in both modes; tp.sh tp's
# canonical norms; neither dp's nor tp's fast-mode norms, nor clipping across layouts):
#  - fast mode (pp.sh does pp): dp=2, tp=2, tp=2 with sequence parallelism and dp=2 with
#    ZeRO 2 and 3 (the norm over gradient partitions) report the one-rank run's
#    gradient norm within 1e-5 relative over 6 steps (only summation order differs);
#  - canonical mode, sgd with grad_clip = 0.05 (below every step's norm, so every step is
#    clipped): dp=2, tp=2, tp=2+sp, pp=2, dp=2 x tp=2 and dp=2 with ZeRO 2 and 3 give the one-rank run's losses and
#    norms bit for bit;
#  - clipping does what it says: the norm is reported before clipping (the clipped and the
#    unclipped run report the same first norm, bitwise), and a clipped sgd step at lr is the
#    unclipped step at lr x clip / norm (step 2's loss within 1e-6 relative), far from the
#    unclipped step at lr.
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
recipe=$here/recipes/nonfinite.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive   # several ranks share 2 cores: OpenMP must not spin
model="model.heads=4 threads=1 steps=6"
keep() { grep -E '^(LOSS|NORM) '; }
run1() { "$loom" run "$recipe" $model "$@" | keep; }
runN() { local n=$1; shift; "$loom" launch -n "$n" "$recipe" $model comm_timeout=20 "$@" | keep; }
# rel_norm_diff A B: the largest relative difference of the decimal norms (field 4)
rel_norm_diff() {
  local d; d=$(max_field_diff '^NORM ' 4 "$1" "$2") || return 1
  awk -v d="$d" -v f="$1" 'BEGIN { m = 1e300 } $1 == "NORM" && $4 < m { m = $4 } END { printf "%.3g", d / m }' "$1"
}

run1 > "$tmp/one"
for layout in "2 mesh.dp=2 batch.micro=2" "2 mesh.tp=2" "2 mesh.tp=2 tp_sequence_parallel=true" \
              "2 mesh.dp=2 batch.micro=2 strategy.zero=2" "2 mesh.dp=2 batch.micro=2 strategy.zero=3"; do
  runN $layout > "$tmp/l"
  n=$(rel_norm_diff "$tmp/one" "$tmp/l")
  below "$n" 1e-5 || { echo "fast ${layout#* }: norms differ from one rank by $n (relative)"; paste "$tmp/one" "$tmp/l"; exit 1; }
  echo "ok fast ${layout#* }: gradient norms within $n (relative) of one rank over 6 steps"
done

sgd='optimizer={"sgd",lr=0.5} lr=0.5'
canon="deterministic=canonical batch.micro=2 batch.global=4 $sgd"
run1 $canon grad_clip=0.05 > "$tmp/c1"
finite_losses "$tmp/c1"
awk '$1 == "NORM" && !($4 > 0.05) { bad = 1 } END { exit bad }' "$tmp/c1" ||
  { echo "a norm is not above the clip 0.05: nothing to clip"; cat "$tmp/c1"; exit 1; }
for layout in "2 mesh.dp=2" "2 mesh.tp=2" "2 mesh.tp=2 tp_sequence_parallel=true" \
              "2 mesh.pp=2 microbatches=2" "4 mesh.dp=2 mesh.tp=2" "2 mesh.dp=2 strategy.zero=2" \
              "2 mesh.dp=2 strategy.zero=3"; do
  runN ${layout%% *} $canon grad_clip=0.05 ${layout#* } > "$tmp/c"
  cmp -s "$tmp/c1" "$tmp/c" || { echo "canonical clipped ${layout#* } differs from one rank:"; paste "$tmp/c1" "$tmp/c"; exit 1; }
  echo "ok canonical ${layout#* }, grad_clip=0.05: losses and norms bitwise one rank's (6 steps, each clipped)"
done

# What the clip does, on one rank: step 2's loss shows step 1's update.
run1 $canon grad_clip=0 > "$tmp/free"
n1=$(awk '$1 == "NORM" && $2 == 1 { print $4 }' "$tmp/c1")
[ "$(grep '^NORM 1 ' "$tmp/c1" | cut -d' ' -f3)" = "$(grep '^NORM 1 ' "$tmp/free" | cut -d' ' -f3)" ] ||
  { echo "the clipped run reports another first norm than the unclipped one: not the pre-clip norm"; exit 1; }
lr_eq=$(awk -v n="$n1" 'BEGIN { printf "%.9g", 0.5 * 0.05 / n }')
run1 $canon grad_clip=0 lr=$lr_eq 'optimizer={"sgd",lr='$lr_eq'}' > "$tmp/scaled"
loss2() { awk '$1 == "LOSS" && $2 == 2 { print $4 }' "$1"; }
rel() { awk -v a="$1" -v b="$2" 'BEGIN { d = (a - b) / b; printf "%.3g", d < 0 ? -d : d }'; }
near=$(rel "$(loss2 "$tmp/c1")" "$(loss2 "$tmp/scaled")"); far=$(rel "$(loss2 "$tmp/c1")" "$(loss2 "$tmp/free")")
below "$near" 1e-6 || { echo "clipped step 1 is not the step at lr x clip/norm: step 2 loss rel diff $near"; exit 1; }
below 1e-4 "$far" || { echo "clipped and unclipped step 2 losses too close ($far): did the clip act?"; exit 1; }
echo "ok grad_clip=0.05: first norm $n1 reported before clipping; the clipped step is the unclipped one at lr x clip/norm = $lr_eq (step 2 loss rel diff $near), the unclipped one at lr is $far away"
