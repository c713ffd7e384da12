#!/bin/sh
# lib_test.sh — the number helpers of lib.sh checked on made-up files: a non-finite loss
# in any spelling awk or Lua prints, a shorter file, an empty file, mismatched steps must
# each be refused; equal files give 0; a difference within / beyond a tolerance passes /
# fails; "the loss fell" likewise. POSIX sh, as tests/oot_plugin sources lib.sh from sh.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
bad=0
no() { echo "FAIL: $*"; bad=1; }
ok() { echo "ok $*"; }

# five steps, the loss falling from 5.5 to 3.5; field 3 (hex) is not looked at
losses() { # FILE LAST-LOSS [STEPS]
  i=1; : > "$1"
  for v in 5.500000000 5.000000000 4.500000000 4.000000000 "$2"; do
    [ "$i" -le "${3:-5}" ] && { echo "LOSS $i 0x1p+2 $v"; echo "NORM $i 0x1p-1"; } >> "$1"
    i=$((i + 1))
  done
}
losses "$tmp/a" 3.500000000
cp "$tmp/a" "$tmp/a2"
losses "$tmp/near" 3.500010000
losses "$tmp/short" 3.500000000 4
: > "$tmp/empty"
sed 's/^LOSS 3 /LOSS 7 /' "$tmp/a" > "$tmp/steps"
echo "done" > "$tmp/noloss"

d=$(max_loss_diff "$tmp/a" "$tmp/a2") && [ "$d" = 0 ] && below "$d" 1e-12 &&
  ok "equal files: max_loss_diff 0, below 1e-12" || no "equal files gave '$d'"
d=$(max_loss_diff "$tmp/a" "$tmp/near") && [ "$d" = 1e-05 ] && below "$d" 2e-5 &&
  ok "1e-5 apart: $d, below 2e-5" || no "1e-5 apart gave '$d' or was not below 2e-5"
below "$d" 1e-5 && no "1e-5 is below 1e-5" || ok "1e-5 is not below 1e-5"
below "$d" 1e-6 && no "1e-5 is below 1e-6" || ok "1e-5 is not below 1e-6"

for v in nan -nan NaN inf -inf Inf INF -Infinity "nan(0x8000)" "" 1e400 1e400x 0x1p+2 abc; do
  losses "$tmp/x" "$v"
  if d=$(max_loss_diff "$tmp/a" "$tmp/x" 2> "$tmp/err"); then
    no "a last loss of '$v' was accepted (max diff '$d')"
  else
    grep -q "not a finite number" "$tmp/err" && ok "loss '$v' refused: $(cat "$tmp/err")" ||
      no "loss '$v' refused for another reason: $(cat "$tmp/err")"
  fi
  max_loss_diff "$tmp/x" "$tmp/a" > /dev/null 2>&1 && no "'$v' accepted as the first file"
  finite_losses "$tmp/x" 2> /dev/null && no "finite_losses accepted '$v'"
  loss_fell "$tmp/x" 0.5 > /dev/null 2>&1 && no "loss_fell accepted a last loss of '$v'"
  below "$v" 1 2> /dev/null && no "below accepted '$v' as the difference"
  below 0 "$v" 2> /dev/null && no "below accepted '$v' as the tolerance"
done

for f in short empty steps noloss missing; do
  if max_loss_diff "$tmp/a" "$tmp/$f" > /dev/null 2> "$tmp/err" ||
     max_loss_diff "$tmp/$f" "$tmp/a" > /dev/null 2>&1; then
    no "the $f file was compared"
  else
    ok "the $f file refused: $(cat "$tmp/err")"
  fi
done
finite_losses "$tmp/a" "$tmp/near" && ok "finite_losses on two good files" || no "finite_losses refused good files"
for f in empty noloss missing; do
  finite_losses "$tmp/a" "$tmp/$f" 2> /dev/null && no "finite_losses accepted the $f file"
done

out=$(loss_fell "$tmp/a" 1.5) && [ "$out" = "5.500000000 -> 3.500000000" ] &&
  ok "loss fell: $out (by more than 1.5)" || no "loss_fell 1.5 refused or printed '$out'"
loss_fell "$tmp/a" 2 > /dev/null && no "a fall of exactly 2 counted as more than 2" || ok "a fall of 2 is not more than 2"
losses "$tmp/up" 6.000000000
loss_fell "$tmp/up" 0 > /dev/null && no "a rising loss fell" || ok "a rising loss did not fall"
head -n 2 "$tmp/a" > "$tmp/one"
loss_fell "$tmp/one" 0 > /dev/null 2>&1 && no "one step counted as a fall" || ok "one step is not a fall"
loss_fell "$tmp/empty" 0 > /dev/null 2>&1 && no "an empty file fell" || ok "an empty file did not fall"

# the general form, as tests/oot_plugin uses it (several fields a line)
printf 'step 1 0.5 -0.25\nstep 2 1 2\n' > "$tmp/p"; printf 'step 1 0.5 -0.25\nstep 2 1 2.5\n' > "$tmp/q"
d=$(max_field_diff '^step ' "3 4" "$tmp/p" "$tmp/q") && [ "$d" = 0.5 ] &&
  ok "max_field_diff over fields 3 and 4: $d" || no "max_field_diff gave '$d'"
printf 'step 1 0.5 -nan\nstep 2 1 2\n' > "$tmp/q"
max_field_diff '^step ' "3 4" "$tmp/p" "$tmp/q" > /dev/null 2>&1 && no "max_field_diff accepted -nan in field 4"

# runs_close: losses and norms within a tolerance, a missing last step refused
printf 'LOSS 1 0x1p+2 4.0\nNORM 1 0x1p+0 1.0\nLOSS 2 0x1p+2 3.0\nNORM 2 0x1p+0 2.0\n' > "$tmp/w"
sed 's/^NORM 2 0x1p+0 2.0$/NORM 2 0x1p+0 2.001/' "$tmp/w" > "$tmp/g"
runs_close close "$tmp/w" "$tmp/g" 2 1e-2 > /dev/null && ok "runs_close: a norm 1e-3 off within 1e-2" ||
  no "runs_close refused a norm 1e-3 off at 1e-2"
runs_close close "$tmp/w" "$tmp/g" 2 1e-4 > /dev/null && no "runs_close passed a norm 1e-3 off at 1e-4" ||
  ok "runs_close: a norm 1e-3 off beyond 1e-4"
runs_close close "$tmp/w" "$tmp/w" 3 1 > /dev/null && no "runs_close passed a run without step 3" ||
  ok "runs_close: a missing step refused"

[ $bad -eq 0 ] && echo "PASS: lib.sh refuses non-finite, missing and mismatched values" || exit 1
