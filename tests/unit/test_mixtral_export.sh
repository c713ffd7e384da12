#!/usr/bin/env bash
# test_mixtral_export.sh LOOM CHECKER DATA PYTHON — `loom ckpt export` of a loom.llama
# checkpoint with moe (every block 4 SwiGLU experts, top-2, dropless) in Hugging Face's
# Mixtral layout: a tiny model trained 2 steps and saved, exported, and checked by
# check_mixtral_export.py (names, shapes, values bitwise the checkpoint's, config.json, and
# HF's Mixtral forward gives the val loss loom evaluated on the saved weights).
# Then the refusals: moe.every=2 (dense and MoE blocks mixed) and top_k=1.
set -euo pipefail
loom=$1 checker=$2 data=$3 python=$4
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/r.lua" <<LUA
local loom = require "loom"
loom.train {
  model = loom.llama { vocab = 256, ctx = 16, layers = 2, heads = 4, kv_heads = 2, dim = 16,
    ffn_dim = 24, moe = { experts = 4, top_k = 2, every = 1, capacity_factor = 0 } },
  data = loom.data.text { path = "$data", val_fraction = 0.1 },
  optimizer = { "adamw", lr = 3e-2 }, batch = { micro = 2, seq = 16 }, steps = 2, seed = 7,
  threads = 1, log = { every = 100 }, checkpoint = { dir = "$tmp/ck", every = 2 },
  eval = { every = 2, batches = 1 },
  on_step = function(r) if r.val_loss then print(string.format("VAL %.17g", r.val_loss)) end end,
}
LUA
"$loom" run "$tmp/r.lua" > "$tmp/run.log" 2>&1 || { cat "$tmp/run.log"; exit 1; }
ck="$tmp/ck/step_00000002"
mkdir "$tmp/hf"
"$loom" ckpt export "$ck" "$tmp/hf/model.safetensors" > "$tmp/export.log"
grep -q "Hugging Face Mixtral names" "$tmp/export.log" || { cat "$tmp/export.log"; exit 1; }
val=$(awk '$1 == "VAL" { print $2 }' "$tmp/run.log")
[[ -n $val ]] || { echo "FAIL: no val loss in the run's output"; cat "$tmp/run.log"; exit 1; }
"$python" "$checker" "$tmp/hf" "$ck/model.safetensors" "$data" 0.1 2x16 "$val"
refuse() { # refuse WORDS OVERRIDE: a model trained with OVERRIDE is not exported, saying WORDS
  local want=$1 over=$2
  rm -rf "$tmp/ck"
  "$loom" run "$tmp/r.lua" "$over" steps=1 checkpoint.every=1 > "$tmp/run.log" 2>&1 || { cat "$tmp/run.log"; exit 1; }
  if "$loom" ckpt export "$tmp/ck/step_00000001" "$tmp/x.safetensors" > "$tmp/err" 2>&1; then
    echo "FAIL: exported a model with $over"; exit 1
  fi
  grep -q -- "$want" "$tmp/err" || { echo "FAIL: $over: did not say '$want':"; cat "$tmp/err"; exit 1; }
}
refuse "mixes dense and MoE blocks" model.moe.every=2
refuse "Mixtral renormalises the chosen gates" model.moe.top_k=1
echo "ok refused: moe.every=2 (no Mixtral equivalent), top_k=1 (Mixtral's gate would be 1)"
