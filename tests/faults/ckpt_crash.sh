#!/usr/bin/env bash
# ckpt_crash.sh LOOM LIBIOFAIL [sample|full] — checkpoint crash safety, 2 ranks (tp=2: both
# ranks write their shards), tiny model, through the LD_PRELOAD shim libiofail.so:
#  - ENOSPC and EIO at rank 0's first open, write, fsync and rename of the save at step 4: the
#    run fails naming the error, and the previous checkpoint (step 2) still resumes bitwise;
#  - a crash (SIGKILL) at the N-th I/O call of that save, on either rank: the next load finds
#    step 2 or step 4, never a partial one, and resuming from it reproduces the reference
#    losses bitwise (sample: the middle and the last call of each rank; full: every N of
#    both ranks);
#  - kill -9 of a rank at 20 points drawn with a fixed seed (10 at a communicator operation
#    through LOOM_INJECT_DIE, 10 at an I/O call inside a save): 20/20 resume bitwise
#    (sample: the first of each kind).
# Prints each figure as tried/handled.
set -euo pipefail
loom=$1
shim=$2
mode=${3:-sample}
here=$(cd "$(dirname "$0")" && pwd)
recipe=$here/../e2e/recipes/losses.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive
args=(threads=1 mesh.tp=2 batch.micro=2 comm_timeout=3 checkpoint.every=2)
run() { # DIR STEPS [env...]: train with checkpoints in DIR; LOSS lines on stdout
  local d=$1 steps=$2; shift 2
  env "$@" "$loom" launch -n 2 "$recipe" "${args[@]}" steps="$steps" checkpoint.dir="$d" \
    resume=auto 2> "$tmp/err" | grep '^LOSS' || true
}
fail() { echo "FAIL: $*"; tail -5 "$tmp/err"; exit 1; }

run "$tmp/ref" 5 > "$tmp/ref.loss"
[[ $(wc -l < "$tmp/ref.loss") -eq 5 ]] || fail "the reference run printed no 5 losses"
run "$tmp/base" 2 > /dev/null
[[ -d $tmp/base/step_00000002 ]] || fail "no base checkpoint"

# After a failed run in $tmp/w: the newest complete checkpoint must be step 2 or 4 and a
# resume to step 5 must print exactly the reference's losses after it.
check_resume() {
  local info step
  info=$("$loom" ckpt info "$tmp/w" 2>&1) || { echo "ckpt info fails: $info"; return 1; }
  step=$(sed -n 's/^step[: ]*\([0-9]*\).*/\1/p' <<< "$info" | head -1)
  [[ $step == 2 || $step == 4 ]] || { echo "newest checkpoint is step '$step'"; return 1; }
  run "$tmp/w" 5 > "$tmp/res.loss"
  local want=$((5 - step))
  [[ $(wc -l < "$tmp/res.loss") -eq $want ]] || { echo "resume from $step printed $(wc -l < "$tmp/res.loss") losses, want $want"; return 1; }
  grep -vxFf "$tmp/ref.loss" "$tmp/res.loss" > /dev/null && { echo "resume from $step differs from the reference"; return 1; }
  echo "$step"
}
fresh() { rm -rf "$tmp/w"; cp -r "$tmp/base" "$tmp/w"; }
crash_run() { # env for the crashing run...
  fresh
  run "$tmp/w" 4 "$@" > /dev/null
  cp "$tmp/err" "$tmp/crash.err"
}
iofail_env() { echo LD_PRELOAD="$shim" LOOM_IOFAIL_DIR="$tmp/w" "$@"; }

# 1. ENOSPC / EIO at each kind: a named error, the previous checkpoint intact.
tried=0 handled=0
for what in ENOSPC EIO; do
  for kind in open write fsync rename; do
    tried=$((tried + 1))
    crash_run $(iofail_env LOOM_IOFAIL="$kind:1:$what" LOOM_IOFAIL_RANK=0)
    msg=$([[ $what == ENOSPC ]] && echo "No space left on device" || echo "Input/output error")
    grep -q "$msg" "$tmp/crash.err" || { echo "FAIL $kind $what: no named error"; tail -3 "$tmp/crash.err"; continue; }
    got=$(check_resume) || { echo "FAIL $kind $what: $got"; continue; }
    handled=$((handled + 1))
    echo "ok $what at the first $kind of rank 0's save: $(grep -m1 -o "loom: .*$msg" "$tmp/crash.err" | head -c 200); resumed from step $got bitwise"
  done
done
echo "figure: ENOSPC/EIO at open/write/fsync/rename: $handled/$tried named, previous checkpoint intact"
[[ $handled -eq $tried ]] || exit 1

# 2. A crash at the N-th I/O call of the save.
fresh
rm -f "$tmp/count"
run "$tmp/w" 4 $(iofail_env LOOM_IOFAIL_COUNT="$tmp/count") > /dev/null
declare -A calls
while read -r _ r _ _ _ _ _ _ _ _ _ any; do [[ $any -gt 0 ]] && calls[$r]=$any; done < "$tmp/count"
[[ -n ${calls[0]:-} && -n ${calls[1]:-} ]] || fail "no I/O counted: $(cat "$tmp/count")"
tried=0 handled=0
for r in 0 1; do
  total=${calls[$r]}
  if [[ $mode == full ]]; then ns=$(seq 1 "$total"); else ns="$((total / 2)) $total"; fi
  for n in $ns; do
    tried=$((tried + 1))
    crash_run $(iofail_env LOOM_IOFAIL="any:$n:kill" LOOM_IOFAIL_RANK=$r)
    got=$(check_resume) || { echo "FAIL crash at I/O call $n of $total on rank $r: $got"; continue; }
    handled=$((handled + 1))
    [[ $mode == full ]] || echo "ok crash at I/O call $n of $total on rank $r: resumed from step $got bitwise"
  done
done
echo "figure: a crash at I/O call N of a 2-rank save ($mode: ${calls[0]} + ${calls[1]} calls): $handled/$tried found the old or the new checkpoint and resumed bitwise"
[[ $handled -eq $tried ]] || exit 1

# 3. kill -9 of a random rank at 20 random points (fixed seed).
RANDOM=17
tried=0 handled=0
for i in $(seq 1 20); do
  r=$((RANDOM % 2))
  if [[ $i -le 10 ]]; then
    n=$((RANDOM % 20 + 1)); where="communicator operation $n"
    e=(LOOM_INJECT_DIE="$r:any:$n:kill")
  else
    n=$((RANDOM % calls[$r] + 1)); where="I/O call $n of the save"
    e=($(iofail_env LOOM_IOFAIL="any:$n:kill" LOOM_IOFAIL_RANK=$r))
  fi
  [[ $mode == full || $i -eq 1 || $i -eq 11 ]] || continue
  tried=$((tried + 1))
  crash_run "${e[@]}"
  grep -q "SIGKILL" "$tmp/crash.err" || { echo "FAIL point $i (rank $r, $where): the rank did not die"; continue; }
  got=$(check_resume) || { echo "FAIL point $i (rank $r, $where): $got"; continue; }
  handled=$((handled + 1))
  echo "ok kill -9 of rank $r at $where: resumed from step $got bitwise"
done
echo "figure: kill -9 at random points ($mode): $handled/$tried resumed bitwise"
[[ $handled -eq $tried ]]
