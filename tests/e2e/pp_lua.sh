#!/usr/bin/env bash
# pp_lua.sh LOOM — pipeline schedules written in Lua train (a recipe's schedule = "FILE.lua"
# or schedule = function(shape) -> list; the engine runs the lists after the same checks
# as a plugin's), at pp=2 with 4 micro-batches, fast mode (fp32), 6 steps:
#  - schedules/gpipe.lua gives losses, gradient norms and validation loss bitwise those of
#    the gpipe plugin (the same lists, the same order of operations) and within 2e-5 of one
#    rank; the same from a function in the recipe (recipes/pp_lua_fn.lua);
#  - schedules/gpipe_split.lua (B and W split, which no plugin builds) trains within 2e-5
#    of one rank, holding all 4 micro-batches until their W's; gpipe_reversed.lua (the
#    backwards m-1 first) within 2e-5 too;
#  - canonical mode: gpipe.lua and gpipe_split.lua bitwise one rank; gpipe_reversed.lua
#    refused by canonical mode's order check;
#  - the three wrong schedules in schedules/ are refused before any step with the
#    validator's or simulator's message and the recipe's file name, as is a function that
#    raises, one that returns a non-list, pp_chunks with a list of one chunk, and a
#    missing file.
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
recipe=$here/recipes/pp_probe.lua
sched=$here/schedules
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive   # two ranks share 2 cores: OpenMP must not spin
model="model.heads=4 model.layers=4 steps=6 threads=1"
keep() { grep -E '^(LOSS|NORM|VAL|PEAK)' || true; }
run1() { "$loom" run "$recipe" $model "$@" | keep; }
run2() { local r=$1; shift; "$loom" launch -n 2 "$r" $model comm_timeout=20 mesh.pp=2 microbatches=4 "$@" | keep; }
same() { # name file-a file-b: LOSS, NORM and VAL lines bitwise equal
  finite_losses "$2" "$3" || { echo "$1: missing or non-finite losses"; cat "$2" "$3"; exit 1; }
  cmp -s <(grep -E '^(LOSS|NORM|VAL)' "$2") <(grep -E '^(LOSS|NORM|VAL)' "$3") ||
    { echo "$1: differ"; paste "$2" "$3" | head; exit 1; }
  echo "ok $1: losses, gradient norms and val loss bitwise equal ($(grep -c '^LOSS' "$2") steps)"
}
close() { # name file reference
  [ "$(grep -c '^LOSS' "$2")" -eq 6 ] || { echo "$1: expected 6 steps"; cat "$2"; exit 1; }
  local d
  d=$(max_loss_diff "$3" "$2")
  below "$d" 2e-5 || { echo "$1: losses differ from one rank by $d"; paste "$3" "$2" | head; exit 1; }
  echo "ok $1 vs one rank: max |loss diff| $d over 6 steps"
}

run1 batch.global=16 > "$tmp/one"
run2 "$recipe" schedule=gpipe > "$tmp/plugin"
run2 "$recipe" schedule="$sched/gpipe.lua" > "$tmp/file"
same "schedule=gpipe.lua vs the gpipe plugin" "$tmp/file" "$tmp/plugin"
close "schedule=gpipe.lua" "$tmp/file" "$tmp/one"
PP_LUA_FN=gpipe run2 "$here/recipes/pp_lua_fn.lua" > "$tmp/fn"
same "schedule = function (gpipe's lists) vs the gpipe plugin" "$tmp/fn" "$tmp/plugin"
run2 "$recipe" schedule="$sched/gpipe_split.lua" > "$tmp/split"
close "schedule=gpipe_split.lua (BWD_INPUT, then BWD_WEIGHT)" "$tmp/split" "$tmp/one"
peak=$(awk '$1 == "PEAK" && $2 == 2 { print $3 }' "$tmp/split")
[ "$peak" = 4 ] || { echo "gpipe_split.lua: stage 0 held '$peak' micro-batches, want 4 (all, until the W's)"; exit 1; }
echo "ok gpipe_split.lua holds all 4 micro-batches on stage 0 (until their W's)"

run2 "$recipe" schedule="$sched/gpipe_reversed.lua" > "$tmp/rev"
close "schedule=gpipe_reversed.lua (backwards m-1 first)" "$tmp/rev" "$tmp/one"

canon="deterministic=canonical"
run1 $canon batch.global=16 > "$tmp/c1"
for s in gpipe.lua gpipe_split.lua; do
  run2 "$recipe" $canon schedule="$sched/$s" > "$tmp/c"
  same "canonical schedule=$s vs one rank" "$tmp/c" "$tmp/c1"
done

refused() { # expected-text launch-args...
  local want=$1; shift
  if "$loom" launch "$@" > "$tmp/err" 2>&1; then echo "accepted: $*"; exit 1; fi
  grep -qF -- "$want" "$tmp/err" || { echo "refusal of '$*' lacks '$want':"; cat "$tmp/err"; exit 1; }
  grep -q 'LOSS' "$tmp/err" && { echo "refusal of '$*' came after a step"; exit 1; }
  echo "ok refused ($want)"
}
base="$model comm_timeout=20"
refused "pp_probe.lua:9: schedule=\"$sched/missing_bwd.lua\" with pp=3, microbatches=4: stage 0, instruction 2 (FWD mb 1 chunk 0): micro-batch 1 chunk 0 is forwarded but never backwarded" \
  -n 3 "$recipe" $base mesh.pp=3 microbatches=4 schedule="$sched/missing_bwd.lua"
refused "pp_probe.lua:9: schedule=\"$sched/send_no_recv.lua\" with pp=3, microbatches=4: stage 0, instruction 5 (SEND_ACT mb 2 chunk 0): stage 1 never receives it (it has no RECV_ACT mb 2 chunk 0)" \
  -n 3 "$recipe" $base mesh.pp=3 microbatches=4 schedule="$sched/send_no_recv.lua"
refused "pp_probe.lua:9: schedule=\"$sched/deadlock.lua\" with pp=2, microbatches=2: deadlock: stage 0 waits at instruction 2 (RECV_GRAD mb 0 chunk 0) and stage 1 at instruction 0 (RECV_ACT mb 1 chunk 0)" \
  -n 2 "$recipe" $base mesh.pp=2 microbatches=2 schedule="$sched/deadlock.lua"
PP_LUA_FN=error refused "failed for stage 0: $here/recipes/pp_lua_fn.lua:11: no list for stage 0" \
  -n 2 "$here/recipes/pp_lua_fn.lua" $base mesh.pp=2 microbatches=4
PP_LUA_FN=number refused "pp_lua_fn.lua:10 gave a number for stage 0, not a list of instructions" \
  -n 2 "$here/recipes/pp_lua_fn.lua" $base mesh.pp=2 microbatches=4
refused "gpipe.lua\" with pp=2, microbatches=4: stage 1, instruction 1 (FWD mb 0 chunk 0): its activations are never sent on" \
  -n 2 "$recipe" $base mesh.pp=2 microbatches=4 pp_chunks=2 schedule="$sched/gpipe.lua"
refused "deterministic = \"canonical\": schedule \"$sched/gpipe_reversed.lua\" runs BWD of micro-batch 3 before micro-batch 0's on stage 0 chunk 0" \
  -n 2 "$recipe" $base mesh.pp=2 microbatches=4 deterministic=canonical schedule="$sched/gpipe_reversed.lua"
refused "nosuch.lua: No such file or directory" \
  -n 2 "$recipe" $base mesh.pp=2 microbatches=4 schedule="$tmp/nosuch.lua"
