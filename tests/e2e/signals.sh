#!/usr/bin/env bash
# signals.sh LOOM — preemption: SIGTERM, SIGINT and SIGUSR1 during loom.train finish the
# step, save (checkpoint.dir set), say so, and exit 128 + signo; the saved checkpoint
# resumes bitwise to the uninterrupted run's losses. A second signal ends the run at once.
# Under loom launch the launcher passes the signal on and every rank stops after the same
# step. The recipe (recipes/signal.lua) sends the signal itself after step STOP_AT, so
# nothing here waits or polls.
set -uo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
recipe=$here/recipes/signal.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# The newest step directory's number in a checkpoint dir.
newest() { ls -d "$1"/step_* 2>/dev/null | tail -1 | sed 's/.*step_0*//'; }
# The losses after step k of a run ($1: its output) equal the reference's, bit for bit.
same_after() { # name k ref got
  awk -v k="$2" '$2 > k' "$3" > "$tmp/$1.want"
  grep '^LOSS' "$4" | sed 's/^\[rank 0\] //' > "$tmp/$1.got"
  [[ $(wc -l < "$tmp/$1.got") -eq $((20 - $2)) ]] || fail "$1: resumed run has $(wc -l < "$tmp/$1.got") steps, want $((20 - $2))"
  cmp -s "$tmp/$1.want" "$tmp/$1.got" || { diff "$tmp/$1.want" "$tmp/$1.got"; fail "$1: resumed losses differ"; }
}

"$loom" run "$recipe" | grep '^LOSS' > "$tmp/ref1"
finite_losses "$tmp/ref1"

# 1. One rank, each signal: exit status, message, the save, the exact resume.
for case in TERM:143 INT:130 USR1:138; do
  sig=${case%%:*} want=${case#*:}
  STOP_AT=5 STOP_SIG=$sig "$loom" run "$recipe" checkpoint.dir="$tmp/$sig" > "$tmp/$sig.out" 2> "$tmp/$sig.err"
  rc=$?
  [[ $rc -eq $want ]] || { cat "$tmp/$sig.err"; fail "SIG$sig: exit $rc, want $want"; }
  k=$(newest "$tmp/$sig")
  [[ $k == 6 ]] || fail "SIG$sig: saved step '$k', want 6 (the step in flight when it came)"
  grep -qF "loom: SIG$sig: stopped after step 6, saved $tmp/$sig/step_00000006 (resume=auto continues from it)" "$tmp/$sig.err" ||
    { cat "$tmp/$sig.err"; fail "SIG$sig: no stop message"; }
  "$loom" run "$recipe" checkpoint.dir="$tmp/$sig" resume=auto > "$tmp/$sig.resumed" || fail "SIG$sig: resume failed"
  same_after "$sig" 6 "$tmp/ref1" "$tmp/$sig.resumed"
  echo "ok SIG$sig, one rank: exit $rc, saved step 6, steps 7-20 resumed bitwise"
done

# 2. Without checkpoint.dir: the stop is said, nothing saved, same status.
STOP_AT=3 "$loom" run "$recipe" > /dev/null 2> "$tmp/nodir.err"; rc=$?
[[ $rc -eq 143 ]] || fail "no checkpoint.dir: exit $rc, want 143"
grep -qF "loom: SIGTERM: stopped after step 4; nothing saved (no checkpoint.dir)" "$tmp/nodir.err" ||
  { cat "$tmp/nodir.err"; fail "no checkpoint.dir: no message"; }
echo "ok SIGTERM without checkpoint.dir: exit 143, 'nothing saved' said"

# 3. A second signal: the default action at once (killed by SIGTERM), no save after it.
STOP_AT=5 STOP_N=2 "$loom" run "$recipe" checkpoint.dir="$tmp/twice" checkpoint.every=4 > "$tmp/twice.out" 2> "$tmp/twice.err"
rc=$?
[[ $rc -eq 143 ]] || fail "second signal: exit $rc, want 143"
[[ $(newest "$tmp/twice") == 4 ]] || fail "second signal: saved step $(newest "$tmp/twice"), want only the scheduled step 4"
grep -q "stopped after" "$tmp/twice.err" && fail "second signal: the run finished a step and saved"
last=$(grep '^LOSS' "$tmp/twice.out" | tail -1 | cut -d' ' -f2)
(( last <= 6 )) || fail "second signal: trained on to step $last"
echo "ok second SIGTERM: gone at once (last step $last, no save after step 4)"

# 4. Two ranks under loom launch: the launcher passes SIGTERM on, both ranks stop after
#    the same step and save it, and the 2-rank resume continues bitwise — with dp, with
#    pipeline stages (the stop rides on the step's exchange across stages too) and with
#    ZeRO-2 in bf16 (the save gathers partitions and the 16-bit state).
n=0
for layout in "mesh.dp=2" "mesh.pp=2 microbatches=2" "mesh.dp=2 strategy.zero=2 precision=bf16"; do
n=$((n + 1)); d="$tmp/two$n"
"$loom" launch -n 2 "$recipe" $layout | grep '^LOSS' > "$tmp/ref2"
finite_losses "$tmp/ref2"
STOP_AT=5 STOP_WHO=parent "$loom" launch -n 2 "$recipe" $layout checkpoint.dir="$d" \
  > "$d.out" 2> "$d.err"
rc=$?
[[ $rc -eq 143 ]] || { cat "$d.err"; fail "2 ranks, $layout: launch exit $rc, want 143"; }
grep -qF "loom launch: stopped by SIGTERM (passed on to the 2 running ranks)" "$d.err" ||
  { cat "$d.err"; fail "2 ranks, $layout: no launcher verdict"; }
grep -q "did not stop\|killed" "$d.err" && { cat "$d.err"; fail "2 ranks, $layout: a rank had to be killed"; }
k=$(newest "$d")
[[ -n $k ]] || fail "2 ranks, $layout: nothing saved"
grep -qF "[rank 0] loom: SIGTERM: stopped after step $k, saved" "$d.err" || { cat "$d.err"; fail "2 ranks, $layout: no stop message"; }
last0=$(grep '^LOSS' "$d.out" | tail -1 | cut -d' ' -f2)
last1=$(grep '^\[rank 1\] LOSS' "$d.out" | tail -1 | cut -d' ' -f4)
[[ $last0 == "$k" && $last1 == "$k" ]] || fail "2 ranks, $layout: rank 0 stopped after step $last0, rank 1 after $last1, saved $k"
"$loom" launch -n 2 "$recipe" $layout checkpoint.dir="$d" resume=auto > "$d.resumed" ||
  fail "2 ranks, $layout: resume failed"
grep -v '^\[rank' "$d.resumed" > "$d.r0"
same_after "two$n" "$k" "$tmp/ref2" "$d.r0"
echo "ok SIGTERM to loom launch -n 2 ($layout): exit 143, both ranks stopped after step $k and saved it, steps $((k + 1))-20 resumed bitwise"
done
