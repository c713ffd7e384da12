#!/usr/bin/env bash
# dp.sh LOOM — data parallelism on one node through `loom launch` and the shm communicator:
#  - fast mode: dp=2 and dp=4 with micro-batch b train the same losses as one rank with
#    batch dp*b, within 1e-4 over 20 steps (fp32; only the summation order differs);
#  - the same dp run twice is bitwise identical;
#  - canonical mode: dp=1, 2, 4 with the same global batch give bitwise-identical losses;
#  - save at dp=4, resume at dp=4: bitwise; resume at dp=2 (canonical): bitwise;
#  - kill -9 of one rank mid-run: launch fails within the comm timeout naming that rank,
#    no process and no /dev/shm/loom-* segment is left.
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
recipe=$here/recipes/losses.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive   # several ranks share 2 cores: OpenMP must not spin
run1() { "$loom" run "$recipe" threads=1 "$@" | grep '^LOSS'; }
runN() { local n=$1; shift; "$loom" launch -n "$n" "$recipe" threads=1 mesh.dp="$n" comm_timeout=10 "$@" | grep '^LOSS'; }

run1 batch.micro=8 > "$tmp/one8"
runN 2 batch.micro=4 > "$tmp/dp2"
runN 4 batch.micro=2 > "$tmp/dp4"
for f in dp2 dp4; do
  d=$(max_loss_diff "$tmp/one8" "$tmp/$f")
  below "$d" 1e-4 || { echo "fast $f differs from one rank by $d"; exit 1; }
  echo "ok fast $f vs one rank with the same global batch: max |loss diff| $d over 20 steps"
done
runN 2 batch.micro=4 > "$tmp/dp2b"
finite_losses "$tmp/dp2b"
cmp -s "$tmp/dp2" "$tmp/dp2b" || { echo "dp=2 twice differs"; exit 1; }
echo "ok dp=2 run twice: bitwise identical"

canon="deterministic=canonical batch.micro=2 batch.global=8"
run1 $canon > "$tmp/c1"
runN 2 $canon > "$tmp/c2"
runN 4 $canon > "$tmp/c4"
finite_losses "$tmp/c1" && cmp -s "$tmp/c1" "$tmp/c2" && cmp -s "$tmp/c1" "$tmp/c4" ||
  { echo "canonical dp=1/2/4 differ"; paste "$tmp/c1" "$tmp/c2" "$tmp/c4" | head; exit 1; }
echo "ok canonical: dp=1, 2, 4 bitwise identical ($(wc -l < "$tmp/c1") steps)"

runN 4 $canon steps=10 checkpoint.dir="$tmp/ck" checkpoint.every=5 > /dev/null
# explicit paths, without checkpoint.dir: the resumed runs save nothing that the next one would pick up
runN 4 $canon resume="$tmp/ck/step_00000010" > "$tmp/r4"
runN 2 $canon resume="$tmp/ck/step_00000010" > "$tmp/r2"
awk '$2 > 10' "$tmp/c4" > "$tmp/want"
cmp -s "$tmp/want" "$tmp/r4" || { echo "dp=4 resume at dp=4 differs"; exit 1; }
cmp -s "$tmp/want" "$tmp/r2" || { echo "dp=4 resume at dp=2 differs"; exit 1; }
echo "ok saved at dp=4, resumed at dp=4 and at dp=2: steps 11-20 bitwise identical"

# A rank killed mid-run: the others must not hang.
marker="loom-dp-kill-$$"
start=$(date +%s)
set +e
"$loom" launch -n 4 "$recipe" threads=1 mesh.dp=4 comm_timeout=3 steps=100000 name="$marker" \
  > "$tmp/kill.out" 2>&1 &
launcher=$!
for _ in $(seq 50); do  # wait until training runs
  grep -q '^LOSS 3 ' "$tmp/kill.out" 2>/dev/null && break; sleep 0.2
done
victim=$(pgrep -f "run $recipe.*$marker" | sed -n 3p)
# this job's segments only: other tests running beside this one have their own
job=$(tr '\0' '\n' < "/proc/$victim/environ" | sed -n 's/^LOOM_JOB_ID=//p')
[[ -n $job ]] || { echo "no LOOM_JOB_ID in rank $victim's environment"; exit 1; }
kill -9 "$victim"
wait "$launcher"; rc=$?
set -e
took=$(( $(date +%s) - start ))
[[ $rc -ne 0 ]] || { echo "launch exited 0 after a rank was killed"; exit 1; }
grep -q "was killed by signal 9" "$tmp/kill.out" || { echo "dead rank not named:"; tail "$tmp/kill.out"; exit 1; }
pgrep -f "$marker" > /dev/null && { echo "processes left behind"; pkill -9 -f "$marker"; exit 1; }
ls /dev/shm | grep -q "^loom-$job" && { echo "shm segments left: $(ls /dev/shm | grep "^loom-$job")"; exit 1; }
echo "ok kill -9 of one rank: $(grep -o 'loom launch: .*' "$tmp/kill.out"), after ${took}s, nothing left behind"

# Ranks started by another launcher (torchrun's variables): no loom launch to stop them, so
# the survivors must fail on their own within comm_timeout, naming the dead peer.
port=$(free_port); marker="loom-dp-ext-$$"
for k in 0 1 2; do
  RANK=$k WORLD_SIZE=3 LOCAL_RANK=$k MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$loom" run "$recipe" threads=1 mesh.dp=3 comm_timeout=3 steps=100000 name="$marker" \
    > "$tmp/ext$k.out" 2>&1 &
done
for _ in $(seq 50); do grep -q '^LOSS 3 ' "$tmp/ext0.out" 2>/dev/null && break; sleep 0.2; done
start=$(date +%s)
pkill -9 -f "name=$marker" -n   # the newest: rank 2
set +e; wait; set -e
took=$(( $(date +%s) - start ))
for k in 0 1; do
  # A survivor names rank 2 among the missing (under load it may also name the other
  # survivor, which gave up first: "ranks 1, 2 did not arrive").
  grep -Eq "ranks? ([0-9]+, )*2 did not arrive within 3000 ms" "$tmp/ext$k.out" ||
    { echo "rank $k did not name the dead rank:"; tail -3 "$tmp/ext$k.out"; exit 1; }
done
(( took <= 10 )) || { echo "survivors took ${took}s to fail"; exit 1; }
pgrep -f "$marker" > /dev/null && { echo "processes left behind"; pkill -9 -f "$marker"; exit 1; }
echo "ok external launcher, rank 2 killed: ranks 0 and 1 failed after ${took}s: $(tail -1 "$tmp/ext0.out")"

# Ranks whose recipes differ (here: steps) are refused at start, naming the odd rank.
port=$(free_port)
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
  "$loom" run "$recipe" threads=1 mesh.dp=2 > "$tmp/mm0" 2>&1 &
set +e
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
  "$loom" run "$recipe" threads=1 mesh.dp=2 steps=7 > "$tmp/mm1" 2>&1
rc1=$?; wait $!; rc0=$?
set -e
[[ $rc0 -ne 0 && $rc1 -ne 0 ]] || { echo "mismatched recipes were not refused"; exit 1; }
grep -q "rank 1 runs a different recipe than rank 0" "$tmp/mm0" || { echo "unexpected: $(cat "$tmp/mm0")"; exit 1; }
grep -q '^LOSS' "$tmp/mm0" && { echo "trained before refusing"; exit 1; }
echo "ok different recipes refused: $(tail -n1 "$tmp/mm0")"
