#!/usr/bin/env bash
# full_disk.sh LOOM — the metrics JSONL on a full disk: a named error and a non-zero exit,
# never a silent cut. Two disks that fill unprivileged: /dev/full (every write fails with
# ENOSPC: the first record, before any step) and a file-size limit (ulimit -f with SIGXFSZ
# ignored: writes past 4 KiB fail with EFBIG, mid-run, part-way through a line).
set -uo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
recipe=$here/recipes/losses.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

out=$("$loom" run "$recipe" steps=3 log.jsonl=/dev/full 2>&1); rc=$?
[[ $rc -ne 0 ]] || fail "/dev/full: exit 0"
grep -q '^LOSS' <<<"$out" && fail "/dev/full: trained although the metrics file cannot be written"
grep -qF "loom: metrics file '/dev/full': cannot write the run record: No space left on device" <<<"$out" ||
  fail "/dev/full: no named error: $out"
echo "ok /dev/full: exit $rc before any step: $(grep -o "metrics file.*device" <<<"$out")"

(trap '' XFSZ; ulimit -f 4; exec "$loom" run "$recipe" steps=200 lr.total=200 log.jsonl="$tmp/m.jsonl") \
  > "$tmp/out" 2>&1; rc=$?
[[ $rc -eq 1 ]] || fail "file-size limit: exit $rc, want 1"
msg=$(grep "^loom: metrics file" "$tmp/out") || fail "file-size limit: no named error: $(tail -2 "$tmp/out")"
grep -qE "cannot write the train record of step [0-9]+: File too large" <<<"$msg" || fail "unexpected message: $msg"
step=$(grep -oE 'step [0-9]+:' <<<"$msg" | grep -oE '[0-9]+')
last=$(grep '^LOSS' "$tmp/out" | tail -1 | cut -d' ' -f2)
# on_step prints LOSS after the record is written: the failed step's own line never comes
[[ $last == $((step - 1)) ]] || fail "file-size limit: on_step ran to step $last; the write of step $step failed"
(( $(stat -c %s "$tmp/m.jsonl") <= 4096 )) || fail "the file grew past the limit"
echo "ok file-size limit 4 KiB: stopped at step $step (of 200), exit 1: ${msg#loom: }"
