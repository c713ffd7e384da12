#!/usr/bin/env bash
# plan_teacher.sh LOOM BACKEND — loom plan's figures for a distillation teacher
# (teacher = {...}, docs/DISTILL.md) against what a one-step run of recipes/cuda_train.lua
# reports after step 1 (r.memory: TMEM the teacher's parameters and its gradient buffer, 0
# on every rank: the teacher is frozen,
# TACT its activations, KDBUF the distillation buffers; ACT and MEM's params the student's,
# whose teacher.layers projections and kept blocks the plan counts too), exactly, every rank:
#  BACKEND cpu:
#  - a 2-block dim-32 student, a 1-block dim-16 teacher of ctx 32 (fewer layers, narrower,
#    a longer context than the student's 16: its activations are sized at batch.seq 16),
#    the logit term alone;
#  - a 3-block student at seq 32, a 2-block dim-16 teacher, teacher.layers = {[2] = 1},
#    hidden and attention terms (the projection, the terms' buffers);
#  - the same at batch.seq 8, under the teacher's ctx 32: its activations (sized by the
#    run's sequences, gpt.h max_T) below the seq-32 case's, planned = measured;
#  - a 3-block teacher whose middle block is mapped (the frozen teacher's two shared block
#    outputs and the mapped block's own);
#  - 2 ranks: pp = 2 with teacher.pp = 2 (a 3-block teacher split 2 + 1, its own pipeline's
#    activation sets, the step's teacher rows and the terms' rows on the last stage), and
#    tp = 2 with teacher.tp = 2 (both split; the gathered whole rows);
#  - the plan loom.train writes after the run (plan.jsonl) holds the same teacher bytes.
#  BACKEND cudaemu (or cuda; without a GPU exit 77): the 3-block case with
#  LOOM_CUDA_ATTENTION unset and =flash: under flash the mapped blocks (student 2, teacher
#  1) keep the batched path's probabilities (loom_gpt_keep_block_attention), the others
#  fused, so both activations come out below the batched run's and equal the plan's; the
#  batched case at batch.seq 8 (below the seq-32 case's, as on the CPU); and
#  the 3-block case at tp = 2 (the device's gathers over the tp group).
# About 2 s on the CPU, 2 s emulated (two cores, shared).
set -euo pipefail
loom=$1
backend=${2:-cpu}
here=$(cd "$(dirname "$0")" && pwd)
recipe=$here/recipes/cuda_train.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive
unset LOOM_CUDA_ATTENTION LOOM_CUDA_FLASH_TC
# the teachers, trained one step on the CPU (their checkpoints)
"$loom" run "$recipe" backend=cpu steps=1 model.layers=1 model.dim=16 model.ctx=32 \
  checkpoint.dir="$tmp/t1" checkpoint.every=1 > /dev/null 2>&1
"$loom" run "$recipe" backend=cpu steps=1 model.layers=2 model.dim=16 model.ctx=32 \
  checkpoint.dir="$tmp/t2" checkpoint.every=1 > /dev/null 2>&1
# the plan's figures per stage, in the run's line format (stage k: rank k - 1 under pp)
cat > "$tmp/plan.lua" <<'EOF'
local cli = require "loom.plan_cli"
local p = cli.api(cli.capture(os.getenv("PLAN_RECIPE"), require("loom").overrides()))
for k, m in ipairs(p.memory) do
  print(string.format("%d TMEM %d %d", k, m.teacher_params, m.teacher_grads))
  print(string.format("%d TACT %d", k, m.teacher_activations))
  print(string.format("%d KDBUF %d", k, m.distill))
  print(string.format("%d ACT %d", k, m.activations))
  print(string.format("%d PARAMS %d", k, m.params))
end
EOF
fail=0
# case NAME RANKS PP ENV key=value...: one step on RANKS ranks, then the plan under ENV
# ("-": none); every rank's lines against its stage's plan (ranks of a stage alike)
case_() {
  local name=$1 n=$2 pp=$3 envs=$4; shift 4
  local e=(); [ "$envs" = - ] || read -ra e <<< "$envs"
  rm -rf "$tmp/rd"; mkdir "$tmp/rd"
  if ! env "${e[@]}" "$loom" launch -n "$n" "$recipe" backend="$backend" steps=1 comm_timeout=20 \
      log.jsonl="$tmp/rd/log.jsonl" "$@" > "$tmp/run" 2>&1; then
    if grep -q "not usable here\|no CUDA device" "$tmp/run"; then
      echo "SKIP: no GPU here, backend=$backend did not train"; exit 77
    fi
    echo "FAIL: $name: the run"; tail -5 "$tmp/run"; exit 1
  fi
  PLAN_RECIPE=$recipe env "${e[@]}" "$loom" run "$tmp/plan.lua" backend="$backend" "$@" > "$tmp/plan" 2>&1 ||
    { echo "FAIL: $name: the plan"; tail -5 "$tmp/plan"; exit 1; }
  local ok=1 r
  for ((r = 0; r < n; r++)); do
    local k=$(( r / (n / pp) + 1 )) pre=""
    (( r > 0 )) && pre="\\[rank $r\\] " # (launch prefixes ranks above 0)
    local got want
    got=$(grep -a "^${pre}\(TMEM\|TACT\|KDBUF\|ACT\|MEM 1\) " "$tmp/run" | sed "s/^\[rank $r\] //" |
      awk '$1 == "MEM" { print "PARAMS " $3; next } { print }' | sort || true)
    want=$(awk -v k="$k" '$1 == k { $1 = ""; sub(/^ /, ""); print }' "$tmp/plan" |
      grep -v '^\(TMEM 0 0\|TACT 0\|KDBUF 0\)$' | sort)
    if [ "$got" != "$want" ]; then
      echo "FAIL: $name: rank $r (stage $k): planned / measured:"; diff <(echo "$want") <(echo "$got") || true; ok=0
    fi
  done
  if (( ok )); then
    echo "ok: $name: planned = measured: $(awk '{ k = $1; $1 = ""; s[k] = s[k] (s[k] == "" ? "" : ",") $0 }
      END { for (k = 1; k in s; k++) printf "%sstage %d:%s", (k > 1 ? "; " : ""), k, s[k] }' "$tmp/plan")"
  else
    fail=1
  fi
  # the after-run plan (loom.train's, in the run's process): rank 0's teacher parameter bytes
  local after want_p
  after=$(grep '"rank":0[,}]' "$tmp/rd/plan.jsonl" | grep -o '"teacher_params":[0-9]*' | cut -d: -f2 || true)
  want_p=$(awk '$1 == 1 && $2 == "TMEM" { print $3 }' "$tmp/plan")
  [ "$after" = "$want_p" ] || { echo "FAIL: $name: plan.jsonl teacher_params '$after', not $want_p"; fail=1; }
  # the teacher is frozen (gpt.h): no gradient buffer on any rank
  if grep -a "TMEM " "$tmp/run" | awk '$NF != 0 { bad = 1 } END { exit !bad }'; then
    echo "FAIL: $name: the teacher holds a gradient buffer: $(grep -a 'TMEM ' "$tmp/run" | head -1)"; fail=1
  fi
}
kd3='teacher={checkpoint="'$tmp/t2'",alpha=0.5,layers={[2]=1},hidden=1,attention=10}'
s3=(model.layers=3 model.ctx=32 batch.seq=32 "$kd3")
# the s3 case again at batch.seq 8 (the teacher's ctx is 32): TACT of the plan (= the run's,
# checked by case_) against the seq-32 case's, $1 (a teacher sized at its ctx: the same)
short_seq() {
  case_ "$backend, the 3-block case at batch.seq 8 (teacher ctx 32)" 1 1 - "${s3[@]}" batch.seq=8
  local t8; t8=$(awk '$1 == 1 && $2 == "TACT" { print $3 }' "$tmp/plan")
  if (( t8 < $1 )); then
    echo "batch.seq 8: teacher activations $t8 bytes (batch.seq 32: $1)"
  else
    echo "FAIL: batch.seq 8: teacher activations $t8, not below batch.seq 32's $1"; fail=1
  fi
}
if [ "$backend" = cpu ]; then
  case_ "teacher 1 block dim 16 ctx 32, logits" 1 1 - model.layers=2 \
    'teacher={checkpoint="'$tmp/t1'",alpha=0.5}'
  case_ "teacher 2 blocks dim 16, layers + hidden + attention" 1 1 - "${s3[@]}"
  short_seq "$(awk '$1 == 1 && $2 == "TACT" { print $3 }' "$tmp/plan")"
  "$loom" run "$recipe" backend=cpu steps=1 model.layers=3 model.dim=16 model.ctx=32 \
    checkpoint.dir="$tmp/t3" checkpoint.every=1 > /dev/null 2>&1
  kdp='teacher={checkpoint="'$tmp/t3'",alpha=0.5,pp=2,layers={[1]=2},attention=1}'
  case_ "pp = 2, teacher.pp = 2, layers + attention" 2 2 - model.layers=2 mesh.pp=2 batch.global=4 "$kdp"
  # the mapped block between unmapped ones: its output of its own, theirs in the two shared
  case_ "teacher 3 blocks, its middle one mapped" 1 1 - model.layers=3 model.ctx=32 batch.seq=32 \
    'teacher={checkpoint="'$tmp/t3'",alpha=0.5,layers={[2]=1},hidden=1}'
  case_ "tp = 2, teacher.tp = 2" 2 1 - model.layers=2 mesh.tp=2 'teacher={checkpoint="'$tmp/t2'",alpha=0.5,tp=2}'
else
  case_ "$backend batched, layers + hidden + attention" 1 1 - "${s3[@]}"
  tb=$(awk '$1 == 1 && $2 == "TACT" { print $3 }' "$tmp/plan"); sb=$(awk '$1 == 1 && $2 == "ACT" { print $3 }' "$tmp/plan")
  short_seq "$tb"
  case_ "$backend flash, layers + hidden + attention" 1 1 LOOM_CUDA_ATTENTION=flash "${s3[@]}"
  tf=$(awk '$1 == 1 && $2 == "TACT" { print $3 }' "$tmp/plan"); sf=$(awk '$1 == 1 && $2 == "ACT" { print $3 }' "$tmp/plan")
  # tp = 2 (the terms' rows and per-head sums gathered over the device's tp group)
  case_ "$backend tp = 2, layers + hidden + attention" 2 1 - "${s3[@]}" mesh.tp=2
  if (( tf < tb && sf < sb )); then
    echo "flash: teacher activations $tf bytes (batched $tb), student $sf (batched $sb)"
  else
    echo "FAIL: flash: teacher activations $tf (batched $tb), student $sf (batched $sb): not fewer"; fail=1
  fi
fi
exit $fail
