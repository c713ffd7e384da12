#!/usr/bin/env bash
# test_llama_export.sh FIXTURE_TEST LOOM CHECKER FIXTURE PYTHON — `loom ckpt export` of a
# loom.llama checkpoint in Hugging Face's layout: the fixture's parameters saved as a
# checkpoint (test_llama_fixture --save-checkpoint), exported, and checked by
# check_llama_export.py (names, shapes, values, config.json, HF's forward = the fixture's
# logits).
set -euo pipefail
fixture_test=$1 loom=$2 checker=$3 fixture=$4 python=$5
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$fixture_test" --save-checkpoint "$tmp/ckpt" > "$tmp/save.log" || { cat "$tmp/save.log"; exit 1; }
mkdir "$tmp/hf"
"$loom" ckpt export "$tmp/ckpt" "$tmp/hf/model.safetensors"
"$python" "$checker" "$tmp/hf" "$fixture"
