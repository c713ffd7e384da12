#!/usr/bin/env bash
# plan_flash.sh LOOM BACKEND — loom plan's activation bytes for a run on the CUDA backend
# (BACKEND cudaemu: its kernels emulated, LOOM_PLUGIN_PATH naming the plugin; or cuda)
# against what that run measures (recipes/cuda_train.lua and cuda_train_llama.lua print the
# session's activation bytes, ACT), one step each:
#  - LOOM_CUDA_ATTENTION unset and =flash, GPT-2 at ctx 32 (T longer than a head: the fused
#    kernels): the plan's activations are the run's, exactly, and flash's are smaller than
#    the batched plan's (by the (B,NH,T,T) probabilities less lse and out's copy per block);
#  - flash with deterministic = "canonical" (the batched path: canonical bits), and at ctx 16
#    (T = the head size: no room in att for the fused state): the batched plan's bytes, and
#    the run's;
#  - llama bf16 with grouped-query attention (kv_heads 2 of 4, head size 16): flash (the
#    tensor-core kernels) as the run, smaller than batched; LOOM_CUDA_FLASH_TC=0 (grouped-query
#    attention without the tensor-core kernels is the batched path) as the run;
#  - the plan loom.train makes after each run (plan.jsonl) holds the same bytes;
#  - the assumption line names the path; LOOM_CUDA_ATTENTION=fused is refused by the plan
#    as the backend refuses it.
# The plan reads LOOM_CUDA_ATTENTION (and LOOM_CUDA_FLASH_TC) from its environment and the
# backend from the recipe, as the run does (docs/PLAN.md). BACKEND cuda without a GPU: exit
# 77 (meson's skip). About 5 s on the emulation (two cores, shared).
set -euo pipefail
loom=$1
backend=${2:-cudaemu}
here=$(cd "$(dirname "$0")" && pwd)
gpt=$here/recipes/cuda_train.lua
llama=$here/recipes/cuda_train_llama.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive
unset LOOM_CUDA_ATTENTION LOOM_CUDA_FLASH_TC
# the plan's activation bytes (stage 1) for RECIPE under key=value overrides: PLANACT n
cat > "$tmp/act.lua" <<'EOF'
local cli = require "loom.plan_cli"
local p = cli.api(cli.capture(os.getenv("PLAN_RECIPE"), require("loom").overrides()))
print(string.format("PLANACT %d", p.memory[1].activations))
for _, a in ipairs(p.assumptions) do if a:match("^attention: ") then print("ASSUME " .. a) end end
EOF
fail=0
# case NAME ENV RECIPE key=value...: runs one step and plans it under ENV ("-": none);
# sets act_run, act_plan and prints both
case_() {
  local name=$1 envs=$2 recipe=$3; shift 3
  local e=(); [ "$envs" = - ] || read -ra e <<< "$envs"
  rm -rf "$tmp/rd"; mkdir "$tmp/rd"
  if ! env "${e[@]}" "$loom" run "$recipe" backend="$backend" steps=1 log.jsonl="$tmp/rd/log.jsonl" "$@" \
      > "$tmp/run" 2>&1; then
    if grep -q "not usable here\|no CUDA device" "$tmp/run"; then
      echo "SKIP: no GPU here, backend=$backend did not train: $(grep -m1 'not usable here\|no CUDA device' "$tmp/run")"
      exit 77
    fi
    echo "FAIL: $name: the run"; tail -5 "$tmp/run"; exit 1
  fi
  PLAN_RECIPE=$recipe env "${e[@]}" "$loom" run "$tmp/act.lua" backend="$backend" "$@" > "$tmp/plan" 2>&1 ||
    { echo "FAIL: $name: the plan"; tail -5 "$tmp/plan"; exit 1; }
  act_run=$(awk '$1 == "ACT" { print $2 }' "$tmp/run")
  act_plan=$(awk '$1 == "PLANACT" { print $2 }' "$tmp/plan")
  assume=$(grep '^ASSUME ' "$tmp/plan" | cut -c8- || true)
  [ -n "$act_run" ] && [ -n "$act_plan" ] || { echo "FAIL: $name: no ACT / PLANACT line"; cat "$tmp/run" "$tmp/plan"; exit 1; }
  # the after-run plan (plan.jsonl: loom.train's, in the run's own process and environment)
  act_after=$(grep -o '"activations":[0-9]*' "$tmp/rd/plan.jsonl" | cut -d: -f2 || true)
  if [ "$act_run" = "$act_plan" ] && [ "$act_after" = "$act_plan" ]; then
    echo "ok: $name: activations planned $act_plan bytes (after the run $act_after), measured $act_run"
  else
    echo "FAIL: $name: activations planned $act_plan bytes (after the run '$act_after'), measured $act_run"; fail=1
  fi
}
g32=(model.ctx=32 batch.seq=32)
case_ "gpt fp32 T32 batched" - "$gpt" "${g32[@]}"; gb=$act_plan
grep -q "the batched path" <<< "$assume" || { echo "FAIL: batched: assumption '$assume'"; fail=1; }
case_ "gpt fp32 T32 flash" LOOM_CUDA_ATTENTION=flash "$gpt" "${g32[@]}"; gf=$act_plan
grep -q "the fused kernels" <<< "$assume" || { echo "FAIL: flash: assumption '$assume'"; fail=1; }
# (B 2, NH 2, C 32, 1 block; the most over every T <= 32, as gpt_att.c sizes: att 4096
# floats (T 32) -> lse and out's copy 128 + 2048 (T 32), scratch 8192 -> 2048 (T 16, the
# batched path's: T 17 is the first with room for the fused state))
want=$(( 4 * ((4096 + 8192) - (128 + 2048 + 2048)) ))
[ $((gb - gf)) -eq "$want" ] || { echo "FAIL: flash plan $gf bytes, batched $gb: $((gb - gf)) fewer, not $want"; fail=1; }
echo "gpt T32: flash plans $gf bytes of activations, batched $gb ($((gb - gf)) fewer)"
case_ "gpt fp32 T32 batched canonical" - "$gpt" "${g32[@]}" deterministic=canonical; gc=$act_plan
case_ "gpt fp32 T32 flash canonical" LOOM_CUDA_ATTENTION=flash "$gpt" "${g32[@]}" deterministic=canonical
[ "$act_plan" = "$gc" ] || { echo "FAIL: canonical flash plan $act_plan bytes, not the batched $gc"; fail=1; }
grep -q "keeps the batched path" <<< "$assume" || { echo "FAIL: canonical: assumption '$assume'"; fail=1; }
case_ "gpt fp32 T16 batched" - "$gpt"; b16=$act_plan
case_ "gpt fp32 T16 flash (T = head size: the batched path)" LOOM_CUDA_ATTENTION=flash "$gpt"
[ "$act_plan" = "$b16" ] || { echo "FAIL: T16 flash plan $act_plan bytes, not the batched $b16"; fail=1; }
lshape=(model.dim=64 model.ctx=32 batch.seq=32 precision=bf16 model.kv_heads=2)
case_ "llama bf16 kv 2 batched" - "$llama" "${lshape[@]}"; lb=$act_plan
case_ "llama bf16 kv 2 flash (tensor cores)" LOOM_CUDA_ATTENTION=flash "$llama" "${lshape[@]}"; lf=$act_plan
[ "$lf" -lt "$lb" ] || { echo "FAIL: llama flash plan $lf bytes, not fewer than batched $lb"; fail=1; }
case_ "llama bf16 kv 2 flash, LOOM_CUDA_FLASH_TC=0" "LOOM_CUDA_ATTENTION=flash LOOM_CUDA_FLASH_TC=0" "$llama" "${lshape[@]}"
[ "$act_plan" = "$lb" ] || { echo "FAIL: llama flash without tensor cores: plan $act_plan bytes, not the batched $lb"; fail=1; }
out=$(LOOM_CUDA_ATTENTION=fused "$loom" plan "$gpt" backend="$backend" --machine cpu-2core 2>&1) && {
  echo "FAIL: LOOM_CUDA_ATTENTION=fused was planned"; fail=1; }
grep -q 'LOOM_CUDA_ATTENTION=fused; use "batched" (the default) or "flash"' <<< "$out" ||
  { echo "FAIL: LOOM_CUDA_ATTENTION=fused: $out"; fail=1; }
exit $fail
