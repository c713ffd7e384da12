#!/usr/bin/env bash
# schedule.sh LOOM — `loom schedule` (scripts/loom/schedule.lua) and the Lua side of
# pipeline schedules:
#  - `loom schedule 1f1b --pp 4 --micro 8` prints exactly schedules/1f1b_p4_m8.txt: four
#    rows, bubble 3/11 beside the formula, peaks 4, 3, 2, 1;
#  - -o writes a well-formed SVG with a row per stage; --help exits 0 naming its options;
#  - gpipe written in Lua (schedules/gpipe.lua) prints the plugin's rows and bubble;
#  - the three wrong Lua schedules and interleaved with m % p != 0 are refused (exit 1)
#    with their messages; an unknown name lists the sched plugins;
#  - --costs FILE.json gives each instruction its own cost: gpipe.lua at pp=2, m=2 with
#    every instruction costing 1 (F = B) has gpipe's bubble 1/3; a list of the wrong length
#    and a file that is not {"each": [...]} are refused;
#  - schedule_check.lua (under loom run) checks the bindings span for span on a grid.
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
expect_in() { [[ "$1" == *"$2"* ]] || fail "$3: expected '$2' in:"$'\n'"$1"; }
refused() { # refused WANT ARGS...: exit 1 and WANT in stderr
  local want=$1; shift
  local err rc=0
  err=$("$loom" schedule "$@" 2>&1 >/dev/null) || rc=$?
  [ $rc -eq 1 ] || fail "loom schedule $* exited $rc, expected 1"
  expect_in "$err" "$want" "loom schedule $*"
}

out=$("$loom" schedule 1f1b --pp 4 --micro 8)
diff <(printf '%s\n' "$out") "$here/schedules/1f1b_p4_m8.txt" || fail "loom schedule 1f1b --pp 4 --micro 8 changed (diff above)"

"$loom" schedule zb1 --pp 4 --micro 8 -o "$tmp/zb1.svg" > "$tmp/zb1.txt"
expect_in "$(cat "$tmp/zb1.txt")" "wrote $tmp/zb1.svg" "-o says what it wrote"
expect_in "$(cat "$tmp/zb1.txt")" "bubble: simulated 0.111111, formula" "zb1's bubble"
[ "$(grep -c '>stage [0-3]<' "$tmp/zb1.svg")" -eq 4 ] || fail "the SVG should have 4 stage rows"
if command -v xmllint > /dev/null; then xmllint --noout "$tmp/zb1.svg" || fail "the SVG is not well-formed XML"; fi

help=$("$loom" schedule --help) || fail "loom schedule --help exited $?"
for o in --pp --micro --chunks -o "usage: loom schedule" example; do expect_in "$help" "$o" "loom schedule --help"; done

plugin=$("$loom" schedule gpipe --pp 4 --micro 8 | sed -n '3,7p;9p')
lua=$("$loom" schedule "$here/schedules/gpipe.lua" --pp 4 --micro 8 | sed -n '3,7p;9p')
[ "$plugin" == "$lua" ] || fail "gpipe.lua and the gpipe plugin differ:"$'\n'"$plugin"$'\n'"$lua"

refused "stage 0, instruction 2 (FWD mb 1 chunk 0): micro-batch 1 chunk 0 is forwarded but never backwarded" \
  "$here/schedules/missing_bwd.lua" --pp 3 --micro 4
refused "stage 0, instruction 5 (SEND_ACT mb 2 chunk 0): stage 1 never receives it (it has no RECV_ACT mb 2 chunk 0)" \
  "$here/schedules/send_no_recv.lua" --pp 3 --micro 4
refused "deadlock: stage 0 waits at instruction 2 (RECV_GRAD mb 0 chunk 0) and stage 1 at instruction 0 (RECV_ACT mb 1 chunk 0)" \
  "$here/schedules/deadlock.lua" --pp 2 --micro 2
refused "interleaved: microbatches = 6 is not a multiple of stages = 4 (Megatron's interleaved order needs m % p == 0); use 4 or 8 micro-batches, or the 1f1b schedule" \
  interleaved --pp 4 --micro 6 --chunks 2
echo '{"each": [[1], [1]]}' > "$tmp/short.json"
refused "costs.each[1] must list one cost per instruction of stage 0's list (8), got 1" \
  "$here/schedules/gpipe.lua" --pp 2 --micro 2 --costs "$tmp/short.json"
echo '[1, 2]' > "$tmp/notobj.json"
refused 'want a JSON object {"each": [[cost, ...], ...]}' 1f1b --pp 2 --micro 2 --costs "$tmp/notobj.json"
echo '{"each": [[1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]]}' > "$tmp/ones.json"
out=$("$loom" schedule "$here/schedules/gpipe.lua" --pp 2 --micro 2 --costs "$tmp/ones.json")
expect_in "$out" "bubble: simulated 0.333333" "gpipe with every instruction costing 1"
expect_in "$out" "makespan 6.000000" "gpipe with every instruction costing 1"
refused "available: 1f1b, gpipe, interleaved, zb1" nosuch --pp 2 --micro 2
refused "--pp and --micro are required" 1f1b --pp 2
refused "--micro needs a whole number >= 1 (got '0')" 1f1b --pp 2 --micro 0

grep -q "schedule_check: ok" < <("$loom" run "$here/schedule_check.lua") || fail "schedule_check.lua"
echo "schedule: ok"
