#!/usr/bin/env bash
# flight_train.sh LOOM — the flight recorder in a real run: 4-rank dp training (tiny model,
# comm_timeout=1) with rank 2 stopped (SIGSTOP) at its 3rd allreduce: launch fails, the
# survivors' errors name rank 2 and the operation it never completed, the dumps are in
# checkpoint.dir; and debug_desync=true is accepted and trains the same losses as without.
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
recipe=$here/../e2e/recipes/losses.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive
fail() { echo "FAIL: $*"; tail -20 "$tmp/err"; exit 1; }
args=(threads=1 mesh.dp=4 batch.micro=2 comm_timeout=1 steps=3)

set +e
LOOM_INJECT_DIE=2:allreduce:3:stop "$loom" launch -n 4 "$recipe" "${args[@]}" \
  checkpoint.dir="$tmp/ck" checkpoint.every=100 > /dev/null 2> "$tmp/err"
rc=$?
set -e
[[ $rc -ne 0 ]] || fail "a run with a stopped rank succeeded"
line=$(grep -m1 "flight recorder: rank 2 left no dump (dead or stopped) and never completed allreduce #6 on dp" "$tmp/err") ||
  fail "no survivor named rank 2"
for r in 0 1 3; do
  [[ -s $tmp/ck/flight-rank$r.txt ]] || fail "rank $r left no dump in checkpoint.dir"
  grep -q "^stuck: dp allreduce 6 " "$tmp/ck/flight-rank$r.txt" || fail "rank $r's dump does not say where it is stuck"
done
[[ ! -e $tmp/ck/flight-rank2.txt ]] || fail "the stopped rank wrote a dump"
echo "ok stuck rank named: ${line#*loom: }"

"$loom" launch -n 4 "$recipe" "${args[@]}" | grep '^LOSS' > "$tmp/plain"
"$loom" launch -n 4 "$recipe" "${args[@]}" debug_desync=true | grep '^LOSS' > "$tmp/checked"
[[ $(wc -l < "$tmp/plain") -eq 3 ]] && cmp -s "$tmp/plain" "$tmp/checked" ||
  fail "debug_desync changed the losses"
echo "ok debug_desync=true: same losses bitwise over 3 steps"
