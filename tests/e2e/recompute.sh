#!/usr/bin/env bash
# recompute.sh LOOM — activation recomputation (recompute = "none" | "full" | "selective" |
# { blocks }) on the small model with 4 blocks, 6 steps:
#  - every mode trains bitwise the losses and gradient norms of recompute = "none", in fast
#    and canonical mode, on one rank, under pp=2 (1f1b fast, interleaved canonical) and
#    tp=2 (fast; with sequence parallelism fast and canonical); canonical tp=2+sp with full
#    recomputation is bitwise the canonical one-rank run without it;
#  - the activation bytes (session:info().activation_bytes, every rank) drop:
#    full < selective < none and { 0, 3 } < none; on one rank by exactly what the layout
#    says: selective shares one block's attention probabilities and GELU output among the
#    4 blocks (3 x (B*heads*T*T + B*T*4C) floats less), full shares all of a block's
#    activations but its output (3 x that set less);
#  - zb1 (the split backward) with selective: bitwise none, fast and canonical (and
#    canonical zb1 selective is bitwise canonical interleaved none), fewer bytes per rank;
#  - a sample after full recomputation (no key/value cache) is the text of none (cached);
#  - what is not supported (full or by-block recomputation with zb1's split backward) and
#    bad values are refused with a message naming them.
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
recipe=$here/recipes/recompute.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive   # several ranks share 2 cores: OpenMP must not spin
model="model.layers=4 threads=1"
run() { # n (ranks) args...: the run's output
  local n=$1; shift
  if [ "$n" -eq 1 ]; then "$loom" run "$recipe" $model "$@"
  else "$loom" launch -n "$n" "$recipe" $model comm_timeout=20 "$@"; fi
}
bits() { grep -E '^(LOSS|NORM) ' "$1"; }
bytes() { grep -E "^(\[rank $2\] )?ACTBYTES $2 " "$1" | awk '{ print $NF }'; }
same_bits() { # name reference file
  [ "$(grep -c '^LOSS ' "$3")" -eq 6 ] || { echo "$1: expected 6 steps"; cat "$3"; exit 1; }
  finite_losses "$3" || { echo "$1: non-finite losses"; exit 1; }
  cmp -s <(bits "$2") <(bits "$3") || {
    echo "$1: losses or gradient norms differ from recompute = none"; paste <(bits "$2") <(bits "$3") | head; exit 1; }
}

layouts=("1 deterministic=fast" "1 deterministic=canonical"
         "2 mesh.pp=2 schedule=1f1b microbatches=2 deterministic=fast"
         "2 mesh.pp=2 schedule=interleaved microbatches=2 deterministic=canonical"
         "2 mesh.tp=2 deterministic=fast" "2 mesh.tp=2 tp_sequence_parallel=true deterministic=fast"
         "2 mesh.tp=2 tp_sequence_parallel=true deterministic=canonical")
for layout in "${layouts[@]}"; do
  n=${layout%% *} args=${layout#* }
  for mode in none full selective '{0,3}'; do
    run "$n" $args "recompute=$mode" > "$tmp/$mode"
  done
  for mode in full selective '{0,3}'; do same_bits "$args recompute=$mode" "$tmp/none" "$tmp/$mode"; done
  report=""
  for ((r = 0; r < n; r++)); do
    none=$(bytes "$tmp/none" $r) full=$(bytes "$tmp/full" $r) sel=$(bytes "$tmp/selective" $r)
    some=$(bytes "$tmp/{0,3}" $r)
    [ -n "$none" ] && [ -n "$full" ] && [ -n "$sel" ] && [ -n "$some" ] ||
      { echo "$args: rank $r printed no ACTBYTES"; exit 1; }
    [ "$full" -lt "$sel" ] && [ "$sel" -lt "$none" ] && [ "$some" -lt "$none" ] || {
      echo "$args rank $r: activation bytes do not drop: none $none, selective $sel, full $full, {0,3} $some"
      exit 1; }
    report+=" rank $r: none $none, selective $sel, full $full, {0,3} $some;"
  done
  echo "ok $args: full, selective, {0,3} bitwise none (6 steps); activation bytes$report"
  if [ "$n" -eq 1 ]; then
    # B=4, T=ctx=32, C=32, heads=2, 4 blocks: R = 128 rows
    R=128 C=32 att=$((4 * 2 * 32 * 32))
    sel_less=$((3 * (att + R * 4 * C) * 4))
    full_less=$((3 * (4 * R * C + 4 * R + 3 * R * C + att + 2 * R * 4 * C) * 4))
    [ $((none - sel)) -eq "$sel_less" ] ||
      { echo "$args: selective saves $((none - sel)) bytes, the layout says $sel_less"; exit 1; }
    [ $((none - full)) -eq "$full_less" ] ||
      { echo "$args: full saves $((none - full)) bytes, the layout says $full_less"; exit 1; }
    echo "ok $args: selective saves exactly $sel_less bytes, full $full_less"
  fi
  [ "$args" = "deterministic=canonical" ] && cp "$tmp/none" "$tmp/canonical_one"
  [[ "$args" == *interleaved* ]] && cp "$tmp/none" "$tmp/none_pp_canonical"
done
# zb1's split backward: selective (B reruns the attention probabilities, W the GELU)
for det in fast canonical; do
  args="mesh.pp=2 schedule=zb1 microbatches=2 deterministic=$det"
  run 2 $args recompute=none > "$tmp/znone"
  run 2 $args recompute=selective > "$tmp/zsel"
  same_bits "$args recompute=selective" "$tmp/znone" "$tmp/zsel"
  for r in 0 1; do
    [ "$(bytes "$tmp/zsel" $r)" -lt "$(bytes "$tmp/znone" $r)" ] ||
      { echo "$args rank $r: selective does not drop the activation bytes"; exit 1; }
  done
  echo "ok $args: selective bitwise none (6 steps); activation bytes rank 0: none" \
    "$(bytes "$tmp/znone" 0), selective $(bytes "$tmp/zsel" 0)"
done
cmp -s <(bits "$tmp/zsel") <(bits "$tmp/none_pp_canonical") ||
  { echo "canonical zb1 selective differs from canonical interleaved none"; exit 1; }
echo "ok canonical zb1 recompute=selective: bitwise canonical interleaved recompute=none"

same_bits "canonical tp=2+sp recompute=full vs one rank recompute=none" "$tmp/canonical_one" "$tmp/full"
echo "ok canonical tp=2+sp recompute=full: bitwise the canonical one-rank run with recompute=none"

# Sampling: full recomputation has no key/value cache (q, k, v are in the shared set); the
# text is that of none, which uses the cache.
text() { grep -av -E '^(LOSS|NORM|MS|ACTBYTES|step|memory/rank:) ' "$1"; }
run 1 recompute=none 'sample={every=6,tokens=20,prompt="ROMEO:"}' > "$tmp/snone"
run 1 recompute=full 'sample={every=6,tokens=20,prompt="ROMEO:"}' > "$tmp/sfull"
grep -aq '^ROMEO:' "$tmp/snone" || { echo "no sample printed"; cat "$tmp/snone"; exit 1; }
cmp -s <(text "$tmp/snone") <(text "$tmp/sfull") ||
  { echo "sample with recompute=full differs from none"; diff <(text "$tmp/snone") <(text "$tmp/sfull"); exit 1; }
echo "ok sample after recompute=full (no key/value cache): the text of recompute=none"

refused() { # name expected-message args...
  local name=$1 want=$2; shift 2
  if "$@" > "$tmp/err" 2>&1; then echo "$name: not refused"; exit 1; fi
  grep -q -- "$want" "$tmp/err" || { echo "$name: refused without '$want':"; cat "$tmp/err"; exit 1; }
  echo "ok refused: $name"
}
refused "zb1 with recompute=full" 'recompute = "full" (or a list of blocks) with a split backward (schedule = "zb1") not yet' \
  run 2 mesh.pp=2 schedule=zb1 microbatches=2 recompute=full
refused "recompute=bogus" 'recompute="bogus" is not a mode' run 1 recompute=bogus
refused "recompute={4}" 'recompute\[1\]=4 is not a block index: the model.s blocks are 0..3' \
  run 1 'recompute={4}'
refused "recompute={1,1}" 'recompute lists block 1 twice' run 1 'recompute={1,1}'
