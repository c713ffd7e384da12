#!/usr/bin/env bash
# cuda_ep_sparse.sh LOOM — ZeRO-2/3's sparse model buffers (zero_sparse.c) under expert
# parallelism (zero_ep_reduce.c, zero_ep_gather.c, zero_ep_params.c) on the emulated CUDA
# backend (cudaemu: decommitted memory is PROT_NONE, so a touch of a granule not committed
# is a segfault), recipes/cuda_train.lua with a 4-expert top-2 MoE block, 6 blocks,
# dp=2 ep=2, fast mode, small buckets, one step of 2 micro-batches a rank (the later one's
# backward commits the granules the earlier one's reductions gave back):
#  - zero=2 (the gradient buffer sparse) and zero=3 (gradients and parameters): losses and
#    norms bitwise the same run on whole allocations (LOOM_ZERO_SPARSE=0);
#  - the committed peaks on rank 0 (MEM's grads_peak_resident, params_peak_resident) under
#    half the whole buffer, which the whole allocations' peaks equal.
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
recipe=$here/recipes/cuda_train.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
args=(backend=cudaemu comm=shm steps=1 batch.micro=1 batch.global=4 model.layers=6
      model.moe.experts=4 model.moe.top_k=2 mesh.dp=2 mesh.ep=2 strategy.dp.bucket_mb=0.01)
for z in 2 3; do
  "$loom" launch -n 2 "$recipe" "${args[@]}" strategy.zero=$z > "$tmp/s$z" 2> "$tmp/s$z.err" ||
    { echo "zero=$z dp=2 ep=2 on sparse buffers failed:"; cat "$tmp/s$z.err"; exit 1; }
  LOOM_ZERO_SPARSE=0 "$loom" launch -n 2 "$recipe" "${args[@]}" strategy.zero=$z > "$tmp/w$z" \
    2> "$tmp/w$z.err" || { echo "zero=$z dp=2 ep=2 on whole allocations failed:"; cat "$tmp/w$z.err"; exit 1; }
  grep '^LOSS\|^NORM' "$tmp/w$z" > "$tmp/want"
  grep '^LOSS\|^NORM' "$tmp/s$z" > "$tmp/got" || true
  [[ $(grep -c '^LOSS' "$tmp/want") -eq 1 ]] && cmp -s "$tmp/want" "$tmp/got" ||
    { echo "zero=$z dp=2 ep=2 on sparse buffers is not bitwise whole allocations':"; diff "$tmp/want" "$tmp/got"; exit 1; }
  # the whole buffer: zero=2's params bytes (the model's buffer, 4 x total), or what the
  # whole allocations report as their peaks
  read -r _ _ _ _ _ _ wg wp _ <<< "$(grep '^MEM 1 ' "$tmp/w$z")"
  read -r _ _ _ _ _ _ sg sp _ <<< "$(grep '^MEM 1 ' "$tmp/s$z")"
  [[ $z == 2 ]] && { read -r _ _ whole _ <<< "$(grep '^MEM 1 ' "$tmp/s2")"; }
  want_wp=$([[ $z == 3 ]] && echo "$whole" || echo 0)
  [[ $wg -eq $whole && $wp -eq $want_wp ]] ||
    { echo "zero=$z whole allocations: peaks $wg $wp bytes, want $whole $want_wp"; exit 1; }
  (( sg > 0 && 2 * sg < whole )) && { [[ $z == 2 ]] && (( sp == 0 )) || (( sp > 0 && 2 * sp < whole )); } ||
    { echo "zero=$z dp=2 ep=2 sparse: grads peak $sg, params peak $sp bytes; want each (zero=2:" \
           "the grads') above 0 and under half of $whole"; exit 1; }
  echo "zero=$z dp=2 ep=2 (moe, 6 blocks, 2 micro-batches) on sparse buffers bitwise whole" \
    "allocations, one step; committed peaks on rank 0: grads $sg, params $sp of $whole bytes"
done
