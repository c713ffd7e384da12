#!/usr/bin/env bash
# progress_line.sh LOOM — the progress line fits the terminal (scripts/loom/metrics.lua):
#  - on a terminal of COLUMNS = 50, 60, 80, 120 and 200, every progress line (each redraw
#    and each kept line) is at most COLUMNS - 1 characters and ends with its eta or took
#    field (then "| skipped N", N the run's skipped steps so far, for a skipped step): numbers are shortened and columns dropped,
#    never step, loss or eta; that for the made-up wide steps of recipes/progress_lines.lua
#    and for a real short training (recipes/metrics.lua);
#  - into a pipe, every column is kept (mem, and mfu where a peak is known), whatever
#    COLUMNS says;
#  - without a known peak no line shows "mfu n/a" (the line before the first step says why).
# The terminal is faked with script(1) from util-linux; without it the tty half is skipped.
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
wide=$here/recipes/progress_lines.lua
train=$here/recipes/metrics.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# The progress lines of a terminal transcript, one per redraw: split at \r and \n, the
# escape sequences removed, other lines (the mfu note, val lines) left out.
lines() { tr '\r' '\n' < "$1" | sed 's/\x1b\[[0-9;?]*[A-Za-z]//g' | grep -E '^(step )?[0-9 ]+/[0-9]+ \|' || true; }

# Each line fits COLUMNS - 1 and ends with the eta/took field; and there were N of them.
check_fit() { # transcript columns min-lines what
  local n
  n=$(lines "$1" | wc -l)
  (( n >= $3 )) || { cat -A "$1"; fail "$4 at COLUMNS=$2: $n progress lines, expected at least $3"; }
  lines "$1" | awk -v w="$2" -v what="$4" '
    length($0) > w - 1 { print "FAIL: " what " at COLUMNS=" w ": " length($0) " characters: " $0; bad = 1 }
    $0 !~ /\| (eta|took) [0-9hms?]+( \| skip(ped [0-9]+)?)?$/ { print "FAIL: " what " at COLUMNS=" w ": does not end with eta/took: " $0; bad = 1 }
    END { exit bad }' || exit 1
}

if script -qec true /dev/null > /dev/null 2>&1; then
  for cols in 50 60 80 120 200; do
    for opts in "peak=1 devices=8" "peak=0 devices=1"; do
      COLUMNS=$cols script -qec "'$loom' run '$wide' $opts" /dev/null > "$tmp/tty" ||
        { cat "$tmp/tty"; fail "progress_lines.lua $opts failed"; }
      check_fit "$tmp/tty" "$cols" 6 "made-up steps ($opts)"
      if [[ $opts == peak=0* ]] && lines "$tmp/tty" | grep -q 'mfu'; then
        fail "mfu shown without a known peak at COLUMNS=$cols: $(lines "$tmp/tty" | grep mfu | head -1)"
      fi
    done
    # Where there is room nothing is dropped; where there is not, mem goes before mfu.
    if (( cols == 200 )); then
      lines "$tmp/tty" | grep -q '| mem [0-9]*MiB |' || fail "COLUMNS=200 lost the mem column"
    fi
  done
  COLUMNS=100 script -qec "'$loom' run '$wide' peak=1 devices=8" /dev/null > "$tmp/tty"
  first=$(lines "$tmp/tty" | head -1)
  [[ $first == *"| mfu "* && $first != *"| mem "* ]] || fail "at COLUMNS=100 mem must go before mfu: $first"
  # A real run: 5 steps redrawn and 2 kept, on a standard terminal.
  for cols in 60 80 120; do
    COLUMNS=$cols script -qec "'$loom' run '$train' steps=5 every=2" /dev/null > "$tmp/tty"
    check_fit "$tmp/tty" "$cols" 5 "training"
    lines "$tmp/tty" | grep -q 'mfu' && fail "training on a cpu without peak_flops shows mfu"
    grep -q '^mfu n/a (no peak FLOP/s known' "$tmp/tty" || fail "no line saying why there is no mfu"
  done
else
  echo "SKIP terminal checks: no usable script(1)"
fi

# Into a pipe: every column, however narrow COLUMNS says the terminal is.
COLUMNS=40 "$loom" run "$wide" peak=1 devices=8 > "$tmp/pipe"
grep -q $'[\r\033]' "$tmp/pipe" && fail "control characters in piped output"
n=$(grep -c '| mem [0-9]*MiB |' "$tmp/pipe" || true)
[[ $n == 3 ]] || { cat "$tmp/pipe"; fail "piped lines must keep every column (mem on all 3 kept lines)"; }
grep -q '^step      3/100000 | loss 7.2500 | lr 6.00e-04 | norm 0.750 |     0.4 ms |' "$tmp/pipe" ||
  { cat "$tmp/pipe"; fail "piped line not in its full (padded) form"; }
grep -q '| mfu ' "$tmp/pipe" || fail "piped lines with a known peak must show mfu"
grep -q '| mfu    n/a |' "$tmp/pipe" || fail "a step without tokens/s must show mfu n/a where a peak is known"
"$loom" run "$wide" > "$tmp/pipe2"
grep -q 'mfu' <(grep '^step' "$tmp/pipe2") && fail "piped lines without a known peak show mfu: $(grep mfu "$tmp/pipe2")"
echo "progress_line: fits 50-200 columns, keeps eta, full lines into a pipe, no mfu n/a"
