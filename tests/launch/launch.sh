#!/usr/bin/env bash
# launch.sh LOOM — `loom launch` end to end, with recipes/ranks.lua (no training):
#  - output: rank 0's stdout untouched (carriage returns kept), every other line "[rank k] ";
#  - a rank exiting 3: launch exits 3 naming it, the others stopped, nothing left running,
#    no /dev/shm/loom-<job>* left behind;
#  - a rank killed by SIGKILL: named with the signal;
#  - SIGTERM to launch: passed on, every rank gone;
#  - a configuration mismatch: every rank fails naming the odd rank;
#  - ranks started by hand: rank 0 never coming, or rank 2 missing, fail at the timeout
#    naming the rank; bad -n refused.
# Every rank that should be stopped sleeps NAP seconds, a number unique to this run, so that
# pgrep -f NAP finds anything left over (the ranks, their shells, their sleeps).
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../e2e/lib.sh"   # free_port
recipe=$here/recipes/ranks.lua
tmp=$(mktemp -d)
nap=30.$$$RANDOM
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.out "$tmp"/*.err; do [[ -e $f ]] && { echo "== $f"; cat -A "$f"; }; done; exit 1; }
leftovers() { # anything still running with this run's marker: list it, end it (by pid), fail
  local left; left=$(pgrep -f "$nap" || true)
  [[ -z $left ]] || { ps -o pid,pgid,args -p "${left//$'\n'/,}"; kill -KILL $left 2>/dev/null; fail "$1: processes left behind"; }
}
expect_line() { grep -qxF -- "$2" "$1" || fail "expected the line '$2' in $1"; }

# 1. a clean run of 3 ranks
"$loom" launch -n 3 "$recipe" > "$tmp/ok.out" 2> "$tmp/ok.err" || fail "clean run exited $?"
expect_line "$tmp/ok.out" "rank 0 of 3 (local 0)"
expect_line "$tmp/ok.out" "[rank 1] rank 1 of 3 (local 1)"
expect_line "$tmp/ok.out" "[rank 2] rank 2 of 3 (local 2)"
grep -q $'^progress 1\rprogress 2\rprogress 3$' "$tmp/ok.out" || fail "rank 0's redraws were altered"
expect_line "$tmp/ok.err" "[rank 0] stderr of rank 0"
expect_line "$tmp/ok.err" "[rank 2] stderr of rank 2"
[[ $(grep -c . "$tmp/ok.out") -eq 4 ]] || fail "unexpected stdout lines"
echo "ok: clean run, output prefixed"

# 2. rank 2 exits with status 3
mkdir "$tmp/d2"
set +e
"$loom" launch -n 4 "$recipe" dir="$tmp/d2" nap="$nap" fail=2:3 shm=1 > "$tmp/fail.out" 2> "$tmp/fail.err"
rc=$?
set -e
[[ $rc -eq 3 ]] || fail "launch exited $rc, expected 3"
expect_line "$tmp/fail.err" "loom launch: rank 2 exited with status 3; stopped the other 3 ranks"
leftovers "exit 3"
job=$(cat "$tmp/d2/job")
[[ ${#job} -eq 16 ]] || fail "LOOM_JOB_ID '$job' is not 16 hex digits"
if compgen -G "/dev/shm/loom-$job*" > /dev/null; then fail "/dev/shm/loom-$job* left behind"; fi
echo "ok: rank 2 exit 3 reported, others stopped, nothing left"

# 3. rank 1 killed by SIGKILL mid-run
mkdir "$tmp/d3"
set +e
"$loom" launch -n 3 "$recipe" dir="$tmp/d3" nap="$nap" kill9=1 > "$tmp/kill.out" 2> "$tmp/kill.err"
rc=$?
set -e
[[ $rc -eq 137 ]] || fail "launch exited $rc, expected 137"
expect_line "$tmp/kill.err" "loom launch: rank 1 was killed by signal 9 (SIGKILL); stopped the other 2 ranks"
leftovers "SIGKILL"
echo "ok: SIGKILL named"

# 4. SIGTERM to launch reaches every rank
mkdir "$tmp/d4"
"$loom" launch -n 3 "$recipe" dir="$tmp/d4" nap="$nap" > "$tmp/term.out" 2> "$tmp/term.err" &
pid=$!
for _ in $(seq 100); do
  [[ -e $tmp/d4/ready.0 && -e $tmp/d4/ready.1 && -e $tmp/d4/ready.2 ]] && break
  sleep 0.1
done
[[ -e $tmp/d4/ready.2 ]] || fail "the ranks did not start"
kill -TERM "$pid"
set +e
wait "$pid"
rc=$?
set -e
[[ $rc -eq 143 ]] || fail "launch exited $rc after SIGTERM, expected 143"
expect_line "$tmp/term.err" "loom launch: stopped by SIGTERM (passed on to the 3 running ranks)"
leftovers "SIGTERM"
echo "ok: SIGTERM passed on"

# 5. a configuration mismatch fails every rank, naming rank 1
set +e
"$loom" launch -n 3 "$recipe" mismatch=1 > "$tmp/cfg.out" 2> "$tmp/cfg.err"
rc=$?
set -e
[[ $rc -eq 1 ]] || fail "launch exited $rc on a config mismatch, expected 1"
grep -q '^\[ranks\? [0-9,-]*\] loom: .*ranks.lua:[0-9]*: rank 1 runs a different recipe than rank 0 (config hash [0-9a-f]\{8\}… vs [0-9a-f]\{8\}…)$' "$tmp/cfg.err" ||
  fail "no mismatch message"
echo "ok: config mismatch named"

# 6. ranks started by hand: rank 0 never comes / rank 2 never comes
port=$(free_port)
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=3 LOOM_RENDEZVOUS_TIMEOUT_MS=1500
set +e
# (ranks.lua has no collective, so the ranks meet once it has run: loom run opens the
# rendezvous at a recipe's first collective, or after it, so a recipe's comm_timeout bounds it)
RANK=1 "$loom" run "$recipe" 2> "$tmp/r1.err" &
p1=$!
RANK=2 "$loom" run "$recipe" 2> "$tmp/r2.err"
rc2=$?
wait $p1
rc1=$?
set -e
[[ $rc1 -eq 1 && $rc2 -eq 1 ]] || fail "ranks without rank 0 exited $rc1, $rc2"
for f in "$tmp/r1.err" "$tmp/r2.err"; do
  expect_line "$f" "loom: rendezvous: rank 0 of 3 did not arrive at 127.0.0.1:$port within 1500 ms (nothing is listening there; rank 0 serves the rendezvous)"
done
set +e
RANK=0 "$loom" run "$recipe" 2> "$tmp/s0.err" &
p0=$!
RANK=1 "$loom" run "$recipe" 2> "$tmp/s1.err" > /dev/null
rc1=$?
wait $p0
rc0=$?
set -e
[[ $rc0 -eq 1 && $rc1 -eq 1 ]] || fail "ranks without rank 2 exited $rc0, $rc1"
expect_line "$tmp/s0.err" "loom: rendezvous: rank 2 of 3 did not arrive at 127.0.0.1:$port within 1500 ms"
expect_line "$tmp/s1.err" "loom: rendezvous: rank 2 of 3 did not arrive at 127.0.0.1:$port within 1500 ms"
unset MASTER_ADDR MASTER_PORT WORLD_SIZE LOOM_RENDEZVOUS_TIMEOUT_MS
leftovers "by hand"
echo "ok: missing ranks named at the rendezvous timeout"

# 7. bad -n
set +e
"$loom" launch -n 0 "$recipe" 2> "$tmp/n0.err"; rc=$?
set -e
[[ $rc -eq 2 ]] || fail "-n 0 exited $rc"
expect_line "$tmp/n0.err" "loom launch: -n must be between 1 and 256 (got 0)"
"$loom" launch -n 1 "$recipe" > "$tmp/one.out" 2>&1 || fail "-n 1 failed"
expect_line "$tmp/one.out" "rank 0 of 1 (local 0)"
echo "ok: -n checked"
