#!/usr/bin/env bash
# oom.sh LOOM_OOM [sample|full] — out-of-memory injection through recipe load, checkpoint
# load, a step and checkpoint save: loom-oom (the loom program with its allocations
# wrapped, alloc_inject.c) fails the N-th allocation of loom's own code, for every N the
# run makes (full) or 8 evenly spread ones (sample). Each run must end cleanly: exit 0 with
# the clean run's loss bitwise (the allocation's failure was recovered from), or an error
# exit with a "loom:" message, never a signal or an assertion; and no more of its
# blocks may be live at exit than a clean run leaves (the leak check).
set -euo pipefail
loom=$1
mode=${2:-sample}
here=$(cd "$(dirname "$0")" && pwd)
recipe=$here/../e2e/recipes/losses.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive
export LOOM_LUA_PATH=${LOOM_LUA_PATH:-$here/../../scripts}  # loom-oom is not build/loom: name its Lua library
args=(threads=1 batch.micro=2 checkpoint.every=1 resume=auto)
"$loom" run "$recipe" "${args[@]}" steps=1 checkpoint.dir="$tmp/base" > /dev/null 2>&1
[[ -d $tmp/base/step_00000001 ]] || { echo "FAIL: no base checkpoint"; exit 1; }
one() { # N: run with the N-th allocation failing; sets rc, err
  rm -rf "$tmp/w"; cp -r "$tmp/base" "$tmp/w"
  set +e
  LOOM_INJECT_OOM=$1 "$loom" run "$recipe" "${args[@]}" steps=2 checkpoint.dir="$tmp/w" \
    > "$tmp/out" 2> "$tmp/err"
  rc=$?
  set -e
  grep '^LOSS' "$tmp/out" > "$tmp/loss" || true
}
one count
[[ $rc -eq 0 && $(wc -l < "$tmp/loss") -eq 1 ]] || { echo "FAIL: the counting run failed"; cat "$tmp/err"; exit 1; }
cp "$tmp/loss" "$tmp/loss.clean"
read -r total live0 < <(sed -n 's/^loom-oom: \([0-9]*\) allocations, \([0-9]*\) live at exit.*/\1 \2/p' "$tmp/err")
[[ -n $total && $total -gt 0 ]] || { echo "FAIL: no allocation counted"; exit 1; }
if [[ $mode == full ]]; then ns=$(seq 1 "$total"); else ns=$(seq 1 $(( (total + 7) / 8 )) "$total"); fi
tried=0 clean=0 errors=0 named=0 worst=0 bad=0
for n in $ns; do
  tried=$((tried + 1))
  one "$n"
  live=$(sed -n 's/^loom-oom: [0-9]* allocations, \([0-9]*\) live at exit.*/\1/p' "$tmp/err")
  if [[ $rc -eq 0 ]] && ! cmp -s "$tmp/loss" "$tmp/loss.clean"; then
    echo "FAIL N=$n: exit 0 but the loss differs from the clean run's"; bad=1; continue
  fi
  if [[ $rc -ge 128 ]] || grep -qE "Assertion|assertion|Sanitizer|core dumped" "$tmp/err"; then
    echo "FAIL N=$n: crashed (exit $rc)"; tail -3 "$tmp/err"; bad=1; continue
  fi
  if [[ $rc -ne 0 ]]; then
    grep -q "^loom: " "$tmp/err" || { echo "FAIL N=$n: exit $rc without a message"; tail -3 "$tmp/err"; bad=1; continue; }
    errors=$((errors + 1))
    if grep -qiE "out of memory|not enough memory|cannot allocate" "$tmp/err"; then
      named=$((named + 1))
    else
      echo "note N=$n: the error does not say memory: $(grep -m1 '^loom: ' "$tmp/err" | head -c 300)"
    fi
  fi
  if [[ -z $live ]]; then
    echo "FAIL N=$n: exit $rc without loom-oom's line (did it exit normally?)"; tail -3 "$tmp/err"; bad=1; continue
  fi
  [[ $live -gt $worst ]] && worst=$live
  if [[ $live -gt $live0 ]]; then echo "FAIL N=$n: $live blocks live at exit, a clean run leaves $live0"; bad=1; continue; fi
  clean=$((clean + 1))
done
echo "figure: OOM at allocation N of $total (recipe load, checkpoint load, step, save; $mode): $clean/$tried clean ($errors errors, $named of them naming memory; the rest recovered), at most $worst blocks live at exit (clean run: $live0)"
[[ $bad -eq 0 ]]
