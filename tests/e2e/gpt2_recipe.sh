#!/usr/bin/env bash
# gpt2_recipe.sh LOOM — scripts/recipes/gpt2_124m.lua runs as written (the 124M shape,
# optimizer, schedule, checkpoint and log keys all accepted) for one small step on random
# GPT-2 token shards made here (llm.c's shard format), with only the batch, the step count
# and the output paths overridden. Checks the parameter count (124.44M; llm.c counts
# 124.48M, with the embedding's 47 padding rows), a finite first loss near ln(50257) =
# 10.8, and the checkpoint a run with checkpoint.dir writes at its end.
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
recipe=$here/../../scripts/recipes/gpt2_124m.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp" <<'PY'
import struct, random, sys
random.seed(3)
for name, n in (("train_000000.bin", 4096), ("val_000000.bin", 2048)):
    header = [20240520, 1, n] + [0] * 253
    with open(f"{sys.argv[1]}/{name}", "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{n}H", *[random.randrange(50257) for _ in range(n)]))
PY
out=$("$loom" run "$recipe" steps=1 batch.micro=1 batch.seq=64 batch.global=1 eval.batches=1 \
  data.train="$tmp/train_*.bin" data.val="$tmp/val_*.bin" log.jsonl="$tmp/m.jsonl" \
  checkpoint.dir="$tmp/ck" 2>&1) || { echo "$out"; exit 1; }
echo "$out" | grep -F "gpt 124.44M params (L=12 H=12 C=768 V=50257 ctx=1024)" ||
  { echo "not the 124M model:"; echo "$out"; exit 1; }
loss=$(grep -o '"loss":[^,]*' "$tmp/m.jsonl" | head -1 | cut -d: -f2)
awk -v l="$loss" 'BEGIN { exit !(l == l + 0 && l > 10 && l < 11.7) }' ||
  { echo "first loss '$loss' is not near ln(50257) = 10.8"; exit 1; }
[ -f "$tmp/ck/step_00000001/manifest.json" ] || { echo "no checkpoint at the end"; exit 1; }
echo "ok gpt2_124m.lua: 124.44M parameters, first loss $loss, checkpoint at the end"
