#!/usr/bin/env bash
# flight_train.sh LOOM — the flight recorder in a real run: 4-rank dp training (tiny model,
# comm_timeout=1) with rank 2 stopped (SIGSTOP) at its 3rd allreduce: launch fails, the
# survivors' errors name rank 2 and the operation it never completed, the dumps are in
# checkpoint.dir; the same for a p2p wait inside the pipeline engine (pp=2, a rank stopped
# at a recv: the error names the instruction, the rank and its missing send); and
# debug_desync=true is accepted and trains the same losses as without.
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

# The same inside the pipeline engine: pp=2 interleaved, rank 1 stopped at its 5th recv.
# Rank 0 times out in a RECV's wait; its error names the stage and instruction, rank 1,
# and rank 1's send it waits for, and its dump says it is stuck in recv #5 from rank 1.
set +e
LOOM_FLIGHT_DIR="$tmp/pp" LOOM_INJECT_DIE=1:recv:5:stop "$loom" launch -n 2 "$recipe" \
  threads=1 mesh.pp=2 schedule=interleaved microbatches=4 model.layers=4 comm_timeout=1 \
  steps=2 > /dev/null 2> "$tmp/err"
rc=$?
set -e
[[ $rc -ne 0 ]] || fail "a pp run with a stopped rank succeeded"
want="pipeline stage 0, instruction 20 of 40 (RECV_ACT micro-batch 2 chunk 1): shm recv: rank 1 did not send"
line=$(grep -m1 -F "$want" "$tmp/err") || fail "rank 0's error does not name its pipeline instruction"
grep -qF "flight recorder: rank 1 left no dump (dead or stopped) and never completed send #5 to rank 0 on pp; rank 0 waited in its recv #5 from rank 1" <<< "$line" ||
  fail "rank 0's error does not name rank 1 and the send it never made"
grep -q "^stuck: pp recv 5 16384 peer 1$" "$tmp/pp/flight-rank0.txt" || fail "rank 0's dump does not say where it is stuck"
[[ ! -e $tmp/pp/flight-rank1.txt ]] || fail "the stopped rank wrote a dump"
echo "ok stuck pp rank named: ${line#*loom: }"

"$loom" launch -n 4 "$recipe" "${args[@]}" | grep '^LOSS' > "$tmp/plain"
"$loom" launch -n 4 "$recipe" "${args[@]}" debug_desync=true | grep '^LOSS' > "$tmp/checked"
[[ $(wc -l < "$tmp/plain") -eq 3 ]] && cmp -s "$tmp/plain" "$tmp/checked" ||
  fail "debug_desync changed the losses"
echo "ok debug_desync=true: same losses bitwise over 3 steps"
