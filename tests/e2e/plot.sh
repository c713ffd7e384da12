#!/usr/bin/env bash
# plot.sh LOOM — `loom plot` (scripts/loom/plot.lua, the plot part of scripts/loom/cli.lua):
#  - two files overlay: two train-loss series, each file named in the legend, each its colour;
#    files with the same base name are named by their paths;
#  - a half-written last line (a crash) is skipped with a warning naming file:line, exit 0;
#    a bad line in the middle is refused naming file:line;
#  - a file with two "run" objects (a resumed run) gets a marker at the resume step in every
#    panel, a file with one gets none;
#  - the panels: loss, grad norm, tokens/s, lr; the step axis ends at the last step;
#  - --log and --smooth N are accepted and change the output (--smooth 1 does not), a bad
#    --smooth is refused; --help exits 0 with the options and an example.
# The metrics files are written by loom.metrics itself (recipes/plot_runs.lua), no training.
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
runs=$here/recipes/plot_runs.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
wellformed() {
  if command -v xmllint > /dev/null; then xmllint --noout "$1" || fail "$1 is not well-formed XML"; fi
}
# The body of panel $2 in SVG $1.
panel() { sed -n "/<g id=\"panel-$2\">/,/<\/g>/p" "$1"; }

mkdir -p "$tmp/a" "$tmp/b"
"$loom" run "$runs" jsonl="$tmp/a.jsonl"
"$loom" run "$runs" jsonl="$tmp/b.jsonl" steps=30 shift=0.5
"$loom" run "$runs" jsonl="$tmp/resumed.jsonl" resume=20

# Overlay: two series and both names in the legend, in two colours.
"$loom" plot "$tmp/a.jsonl" "$tmp/b.jsonl" -o "$tmp/ab.svg" > "$tmp/out"
grep -qF "wrote $tmp/ab.svg (a.jsonl: 37 steps, 3 validation points; b.jsonl: 30 steps, 3 validation points)" "$tmp/out" ||
  fail "overlay: $(cat "$tmp/out")"
wellformed "$tmp/ab.svg"
n=$(panel "$tmp/ab.svg" loss | grep -c 'data-what="train loss"' || true)
[[ $n == 2 ]] || fail "overlay: $n train-loss series in the loss panel, expected 2"
for f in a.jsonl b.jsonl; do
  grep -q "data-run=\"$f\" data-what=\"train loss\"" < <(panel "$tmp/ab.svg" loss) || fail "overlay: no loss series for $f"
  grep -q "<g class=\"legend\" data-run=\"$f\">" "$tmp/ab.svg" || fail "overlay: $f not in the legend"
  grep -q ">$f</text>" < <(grep -A3 "<g class=\"legend\" data-run=\"$f\">" "$tmp/ab.svg") || fail "overlay: legend lacks the name $f"
done
colors=$(panel "$tmp/ab.svg" loss | grep 'data-what="train loss"' | grep -o 'stroke="#[0-9a-f]*"' | sort -u | wc -l)
[[ $colors == 2 ]] || fail "overlay: the two runs share a colour"
grep -q '>loom: 2 runs</text>' "$tmp/ab.svg" || fail "overlay: title"
# The step axis ends at the last step (37, the longer run): its label, and a line reaching the frame's right edge.
grep -q '>37</text>' < <(panel "$tmp/ab.svg" lr) || fail "the step axis does not end at 37"
grep -q ' 936.0,[0-9.]*"$' < <(grep -o 'points="[^"]*"' "$tmp/ab.svg") || fail "no line reaches the right edge (x 936)"
# Same base name: the paths tell them apart.
cp "$tmp/a.jsonl" "$tmp/a/m.jsonl"; cp "$tmp/b.jsonl" "$tmp/b/m.jsonl"
"$loom" plot "$tmp/a/m.jsonl" "$tmp/b/m.jsonl" -o "$tmp/same.svg" > /dev/null
grep -qF "data-run=\"$tmp/a/m.jsonl\"" "$tmp/same.svg" && grep -qF "data-run=\"$tmp/b/m.jsonl\"" "$tmp/same.svg" ||
  fail "two m.jsonl files are not told apart by their paths"

# The panels of one run, the grad-norm panel with its line; the default output name.
"$loom" plot "$tmp/a.jsonl" > "$tmp/out"
grep -qF "wrote $tmp/a.svg (37 steps, 3 validation points)" "$tmp/out" || fail "default output: $(cat "$tmp/out")"
for id in loss norm tokens lr; do grep -q "<g id=\"panel-$id\">" "$tmp/a.svg" || fail "no $id panel"; done
grep -q '<polyline [^>]*data-what="grad norm"' < <(panel "$tmp/a.svg" norm) || fail "grad-norm panel has no line"
grep -q 'class="resume"' "$tmp/a.svg" && fail "resume marker in a run that did not resume"

# A half-written last line: skipped with a warning, exit 0.
head -c -60 "$tmp/a.jsonl" > "$tmp/cut.jsonl"  # the last line loses its end and its newline
lines=$(wc -l < "$tmp/a.jsonl")
"$loom" plot "$tmp/cut.jsonl" -o "$tmp/cut.svg" > "$tmp/out" 2> "$tmp/err" || { cat "$tmp/err"; fail "a cut last line must not fail"; }
grep -qF "loom: warning: $tmp/cut.jsonl:$lines: last line is not a JSON object" "$tmp/err" ||
  { cat "$tmp/err"; fail "no warning naming $tmp/cut.jsonl:$lines"; }
grep -qF "(36 steps, 3 validation points)" "$tmp/out" || fail "cut file: $(cat "$tmp/out")"
wellformed "$tmp/cut.svg"
# The same line in the middle is an error naming file:line.
{ head -n 5 "$tmp/a.jsonl"; tail -n 1 "$tmp/cut.jsonl"; echo; tail -n +6 "$tmp/a.jsonl"; } > "$tmp/mid.jsonl"
if "$loom" plot "$tmp/mid.jsonl" -o "$tmp/mid.svg" > "$tmp/out" 2>&1; then fail "a bad middle line must be refused"; fi
grep -qF "loom: $tmp/mid.jsonl:6: not a JSON object" "$tmp/out" || { cat "$tmp/out"; fail "refusal must name $tmp/mid.jsonl:6"; }
[[ -e $tmp/mid.svg ]] && fail "a refused file still wrote a plot"

# A resumed run: a marker at step 20 in each of the four panels.
"$loom" plot "$tmp/resumed.jsonl" -o "$tmp/resumed.svg" > /dev/null
wellformed "$tmp/resumed.svg"
n=$(grep -c '<line class="resume" .*resumed after step 20</title>' "$tmp/resumed.svg" || true)
[[ $n == 4 ]] || fail "resumed run: $n resume markers, expected one per panel (4)"
grep -q 'resumed after 20' "$tmp/resumed.svg" || fail "the legend does not say where the run resumed"

# --log and --smooth change the output; --smooth 1 is no smoothing.
"$loom" plot "$tmp/a.jsonl" --log -o "$tmp/log.svg" > /dev/null
"$loom" plot "$tmp/a.jsonl" --smooth 5 -o "$tmp/smooth.svg" > /dev/null
"$loom" plot "$tmp/a.jsonl" --smooth 1 -o "$tmp/smooth1.svg" > /dev/null
wellformed "$tmp/log.svg"; wellformed "$tmp/smooth.svg"
cmp -s "$tmp/a.svg" "$tmp/log.svg" && fail "--log changed nothing"
grep -q '>loss (log)</text>' "$tmp/log.svg" || fail "--log: the loss axis does not say log"
[[ $(panel "$tmp/log.svg" loss | grep -o 'points="[^"]*"' | head -1) != $(panel "$tmp/a.svg" loss | grep -o 'points="[^"]*"' | head -1) ]] ||
  fail "--log: the loss line did not move"
cmp -s "$tmp/a.svg" "$tmp/smooth.svg" && fail "--smooth 5 changed nothing"
loss_line() { panel "$1" loss | grep 'data-what="train loss"' | grep -o 'points="[^"]*"'; }
[[ $(loss_line "$tmp/smooth.svg") != $(loss_line "$tmp/a.svg") ]] || fail "--smooth 5: the loss line is not smoothed"
grep -qF "$(loss_line "$tmp/a.svg")" < <(panel "$tmp/smooth.svg" loss | grep 'data-what="train loss raw"') ||
  fail "--smooth: the faint line is not the raw loss"
grep -q 'data-what="train loss raw" opacity="0.25"' < <(panel "$tmp/smooth.svg" loss) || fail "--smooth: no faint raw line"
grep -q '>train (mean of 5)</text>' "$tmp/smooth.svg" || fail "--smooth: the key does not say it"
cmp -s "$tmp/a.svg" "$tmp/smooth1.svg" || fail "--smooth 1 must be no smoothing"

# Options refused, and --help.
refuse() { # expected-message args...
  local want=$1; shift
  if "$loom" plot "$@" > "$tmp/msg" 2>&1; then fail "plot $* should fail"; fi
  grep -qF -e "$want" "$tmp/msg" || { cat "$tmp/msg"; fail "plot $*: expected '$want'"; }
}
refuse "--smooth needs a whole number of steps" "$tmp/a.jsonl" --smooth x
refuse "--smooth needs a whole number of steps" "$tmp/a.jsonl" --smooth 0
refuse "--smooth needs a whole number of steps" "$tmp/a.jsonl" --smooth
refuse "unknown option '--lg'" "$tmp/a.jsonl" --lg
refuse "which metrics file?" --log
for h in --help -h; do
  "$loom" plot $h > "$tmp/help" 2>&1 || fail "plot $h must exit 0"
  for want in "usage: loom plot" "--smooth N" "--log" "-o, --output" "example:" "loom plot run/"; do
    grep -qF -e "$want" "$tmp/help" || { cat "$tmp/help"; fail "plot $h lacks '$want'"; }
  done
done
echo "plot: overlay, cut last line, bad middle line, resume marker, panels, --log, --smooth, --help ok"
