#!/usr/bin/env bash
# llmc_export.sh LOOM — train and checkpoint, `loom export --llmc`, then load the llm.c
# file with loom.gpt{init=} and check it equals the checkpoint (losses and samples).
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$loom" run "$here/recipes/losses.lua" steps=4 checkpoint.dir="$tmp/ck" checkpoint.every=4 > /dev/null
"$loom" export --llmc "$tmp/ck" "$tmp/model.bin"
"$loom" run "$here/recipes/llmc_roundtrip.lua" ckpt="$tmp/ck/step_00000004" bin="$tmp/model.bin"
# A file with a wrong version is refused, naming it.
printf '\xc6\xd7\x34\x01\x04\x00\x00\x00' > "$tmp/bad.bin"; head -c 1016 /dev/zero >> "$tmp/bad.bin"
if out=$("$loom" run "$here/recipes/llmc_roundtrip.lua" ckpt="$tmp/ck/step_00000004" bin="$tmp/bad.bin" 2>&1); then
  echo "bad llm.c file accepted"; exit 1
fi
grep -q "has version 4; loom reads versions 3 (fp32) and 5 (bf16)" <<<"$out" || { echo "unexpected: $out"; exit 1; }
echo "bad version refused: $(grep -o "llm.c model.*" <<<"$out")"

# A GPT-2 file loads under every tensor-parallel layout: each rank takes its slice. From
# the same file, canonical runs at tp=1, 2 and 4 (and tp=2 x dp=2) give the same losses and
# gradient norms bit for bit, fast tp=2 is within fp32 rounding of one rank, and the file's
# weights are really used (the first loss differs from a fresh initialisation's).
source "$here/lib.sh"
"$loom" run "$here/recipes/losses.lua" model.heads=4 steps=3 checkpoint.dir="$tmp/ck4" > /dev/null
"$loom" export --llmc "$tmp/ck4" "$tmp/m4.bin" > /dev/null
init="model.heads=4 model.init=$tmp/m4.bin steps=4"
canon="deterministic=canonical batch.micro=2 batch.global=4"
"$loom" run "$here/recipes/losses.lua" $init $canon | grep -E '^(LOSS|NORM)' > "$tmp/i1"
"$loom" run "$here/recipes/losses.lua" model.heads=4 steps=4 $canon | grep -E '^(LOSS|NORM)' > "$tmp/fresh"
[ "$(grep -c '^LOSS' "$tmp/i1")" -eq 4 ] || { echo "init run: expected 4 LOSS lines"; cat "$tmp/i1"; exit 1; }
[ "$(head -1 "$tmp/i1")" != "$(head -1 "$tmp/fresh")" ] || { echo "loom.gpt{init=} did not change the first loss"; exit 1; }
for layout in "2 mesh.tp=2" "4 mesh.tp=4" "4 mesh.tp=2 mesh.dp=2" "2 mesh.tp=2 tp_sequence_parallel=true"; do
  "$loom" launch -n ${layout%% *} "$here/recipes/losses.lua" ${layout#* } $init $canon comm_timeout=20 \
    | grep -E '^(LOSS|NORM)' > "$tmp/i"
  cmp -s "$tmp/i1" "$tmp/i" || { echo "init from llm.c at ${layout#* } differs from one rank"; paste "$tmp/i1" "$tmp/i" | head; exit 1; }
  echo "ok llm.c init at ${layout#* }: canonical losses and norms bitwise equal to one rank"
done
"$loom" run "$here/recipes/losses.lua" $init | grep '^LOSS' > "$tmp/f1"
"$loom" launch -n 2 "$here/recipes/losses.lua" $init mesh.tp=2 comm_timeout=20 | grep '^LOSS' > "$tmp/f2"
d=$(max_loss_diff "$tmp/f1" "$tmp/f2")
below "$d" 2e-5 || { echo "llm.c init, fast tp=2: max loss difference $d >= 2e-5"; exit 1; }
echo "ok llm.c init, fast tp=2: within $d of one rank"
