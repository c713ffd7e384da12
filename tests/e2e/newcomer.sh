#!/usr/bin/env bash
# newcomer.sh LOOM — what a new user meets first (issue: help on every command,
# checkpoints that save when asked, every key checked, one error line per job):
#  - `loom CMD --help` exits 0 for every command and names the command's options;
#  - `loom plugins --keys NAME` lists a plugin's keys; unknown names are refused;
#  - `loom bench comm` refuses bad arguments before starting ranks, naming them;
#  - checkpoint.dir without every saves at the end, one line per save; a resume with
#    nothing left says so; a resume with another recipe names the keys that differ;
#  - overrides that no code reads are warned about; loom.options refuses unknown keys;
#  - under loom launch an error every rank hits is printed once, naming the ranks.
set -uo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok   $*"; }
# expect_in TEXT NEEDLE WHAT
expect_in() { grep -qF -- "$2" <<<"$1" && ok "$3" || { fail "$3: no '$2' in:"; echo "$1" | head -5; }; }

# --- help ---------------------------------------------------------------------------
declare -A opts=([run]="key=value" [launch]="-n N" [plugins]="--keys NAME" [plot]="--smooth N"
                 [export]="--llmc" [bench]="--sizes MIN:MAX" [schedule]="--pp P" [sample]="--prompt TEXT"
                 [ckpt]="export CKPT OUT.safetensors" [version]="usage: loom version")
for c in run launch plugins plot export bench schedule sample ckpt version; do
  out=$("$loom" $c --help 2>&1); rc=$?
  [ $rc -eq 0 ] || fail "loom $c --help exited $rc"
  expect_in "$out" "${opts[$c]}" "loom $c --help names its options"
  expect_in "$out" "usage: loom $c" "loom $c --help gives its usage"
done
out=$("$loom" run scripts/none.lua -h 2>&1) && expect_in "$out" "usage: loom run" "loom run RECIPE -h is help, not a key=value" || fail "loom run RECIPE -h exited non-zero"
out=$("$loom" --help); expect_in "$out" "loom CMD --help" "loom --help points to per-command help"

# --- plugins --keys -----------------------------------------------------------------
out=$("$loom" plugins --keys adamw 2>&1); expect_in "$out" "weight_decay" "plugins --keys adamw lists weight_decay"
expect_in "$out" "(required)" "plugins --keys marks required keys"
out=$("$loom" plugins --keys optim/nope 2>&1) && fail "plugins --keys optim/nope accepted"
expect_in "$out" "no plugin 'optim/nope'" "plugins --keys refuses an unknown plugin"

# --- bench comm refusals, before any rank starts ----------------------------------------
for case in "--sizes 1M:1K|--sizes 1M:1K must satisfy" "--op foo|--op foo is not one of" \
            "--comm foo|--comm foo: no comm plugin 'foo'" "-n 1|-n 1: the number of ranks" \
            "--iters x|--iters x must be" "--frob 1|unknown option '--frob'" "-n|-n needs a value"; do
  args=${case%%|*}; want=${case#*|}
  out=$(timeout 20 "$loom" bench comm $args 2>&1); rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "bench comm $args: exit $rc"
  grep -q '^\[rank' <<<"$out" && fail "bench comm $args started ranks"
  expect_in "$out" "$want" "bench comm $args refused"
done

# --- checkpoints ----------------------------------------------------------------------
R=$here/recipes/losses.lua
out=$("$loom" run "$R" steps=3 checkpoint.dir="$tmp/ck" 2>&1)
[ -f "$tmp/ck/step_00000003/manifest.json" ] && ok "checkpoint.dir without every saves at the end" || fail "no final checkpoint without every: $out"
expect_in "$out" "checkpoint step 3 -> $tmp/ck/step_00000003 (" "a save prints one line with size and time"
[ "$(grep -c '^checkpoint step' <<<"$out")" -eq 1 ] || fail "expected one save line"
out=$("$loom" run "$R" steps=3 checkpoint.dir="$tmp/ck" resume=auto 2>&1)
expect_in "$out" "nothing left to do: the checkpoint is at step 3 and the run has steps=3" "a finished resume says so"
grep -q '^checkpoint step' <<<"$out" && fail "a resume with nothing to do saved again"
out=$("$loom" run "$R" steps=4 optimizer.lr=2e-2 checkpoint.dir="$tmp/ck" resume=auto 2>&1)
expect_in "$out" "differs from the one that saved" "a resume with another recipe warns"
expect_in "$out" "optimizer.lr 0.01 -> 0.02, steps 3 -> 4" "the warning names the keys that differ"

# --- overrides nobody reads, loom.options -------------------------------------------------
printf 'local loom = require "loom"\nprint("own loop")\n' > "$tmp/own.lua"
out=$("$loom" run "$tmp/own.lua" stepz=10 2>&1)
expect_in "$out" "never read the command line's overrides (stepz=10)" "an unread override is warned about"
out=$("$loom" run "$tmp/own.lua" 2>&1); grep -q warning <<<"$out" && fail "warned without overrides"
printf 'local loom = require "loom"\nlocal o = loom.options { steps = 10 }\nprint("steps", o.steps)\n' > "$tmp/opt.lua"
out=$("$loom" run "$tmp/opt.lua" steps=3 2>&1); expect_in "$out" "steps	3" "loom.options applies an override"
grep -q warning <<<"$out" && fail "loom.options' overrides reported unread"
out=$("$loom" run "$tmp/opt.lua" stepz=3 2>&1) && fail "loom.options accepted stepz"
expect_in "$out" "opt.lua:2: unknown option 'stepz' (from the command line: stepz=3) (accepted: steps)" "loom.options refuses an unknown key with file:line"

# --- one error line per job under launch -----------------------------------------------
out=$("$loom" launch -n 2 "$R" lr.foo=1 2>&1) && fail "launch with lr.foo=1 succeeded"
n=$(grep -c "unknown key 'lr.foo'" <<<"$out")
[ "$n" -eq 1 ] && ok "an error every rank hits is printed once" || { fail "the error was printed $n times:"; echo "$out"; }
grep -qE "^\[ranks? [0-9,-]+\] loom: .*unknown key 'lr.foo'" <<<"$out" && ok "the line names the ranks" || fail "no ranks named: $out"

echo "$fails failed"
[ $fails -eq 0 ]
