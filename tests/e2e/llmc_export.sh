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
