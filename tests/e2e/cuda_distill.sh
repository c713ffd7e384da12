#!/usr/bin/env bash
# cuda_distill.sh LOOM BACKEND STEPS TOL — knowledge distillation (teacher = {...},
# docs/DISTILL.md) in a device backend's memory: the teacher on the same backend, forward
# only, the logit term on the backend's kd_rows op (kernels/cuda/distill.cu). On
# recipes/cuda_train.lua's 1-block student, from a 2-block dim-48 teacher trained 3 steps on
# the CPU (its checkpoint):
#  - T = 2, alpha = 0.7: every step's loss and gradient norm within TOL of the CPU backend's
#    distilled run, and not the device's undistilled losses (a term that did nothing fails);
#  - a llama teacher (2 blocks, GQA) and a MoE teacher (4 experts, top-2), each trained 3
#    steps on the CPU, to the same GPT-2 student (only the teacher runs their ops): within
#    TOL of the CPU's distilled run and not the undistilled losses;
#  - with the intermediate terms (teacher.layers = {[0] = 1}, hidden = 1, attention = 10: the
#    teacher's block output and probabilities copied to the host, the terms there, their
#    gradients back; the CUDA backend's attention_backward_datt): within TOL of the CPU's
#    run, and not the logit term's losses alone;
#  - a teacher equal to the student (its own device checkpoint at step 2, resumed there),
#    T = 1, alpha = 1: step 3's loss is the KL alone, exactly 0;
#  - canonical mode, all three terms, a 2-block student (block 1 against the teacher's
#    block 1), batch.micro = 1, batch.global = 2: dp = 2 (two ranks, each its own teacher)
#    and pp = 2 (1f1b; the teacher on the last stage, its rows of the step kept in the
#    backend's memory; or split over the stages by teacher.pp = 2, its activations over the
#    device pp group) give one device rank's losses and norms bitwise;
#  - loom distill-cache on the device backend (the teacher's logits copied to the host per
#    record), k = vocab: training from that cache there gives the in-process teacher's
#    losses and norms bitwise (the cache's rows copied to the device for kd_rows);
#  - the logit term beside mesh.tp (the vocabulary columns gathered over the device tp group,
#    laid out as whole rows by rows_gather), the teacher split over that group (teacher.tp =
#    2), canonical, tp = 2: one device rank's bits; teacher.tp = 2 across dp = 2 too; and
#    beside mesh.ep, a MoE student at canonical dp = 2 x ep = 2: one device rank's bits;
#  - teacher.attention with LOOM_CUDA_ATTENTION=flash (a ctx-32 teacher, a 2-block student
#    at seq 32, block 1 against the teacher's block 1): the mapped blocks on the batched
#    path, the others fused: within TOL of the batched run and of the CPU's, not the
#    batched run's bits, the banner says flash, fewer student (ACT) and teacher (TACT)
#    activation bytes than the batched run; recompute = selective and full its bits;
#  - the intermediate terms beside mesh.tp = 2: fast, both terms, within TOL of the CPU's
#    tp = 2 run and of the device's tp = 1 run; canonical, the hidden term, the attention
#    term and both (teacher.tp = 2, sequence parallelism): one device rank's bits; with
#    LOOM_CUDA_ATTENTION=flash within TOL of the device's tp = 1 and the CPU's tp = 2 runs;
#  - what does not run there is refused by name: teacher.layers with teacher.tp across dp.
# BACKEND cudaemu (tests/cuda's emulation, run under LOOM_CUDAEMU_GUARD=1: a host read of a
# device buffer segfaults) runs everywhere; cuda needs a GPU: exit 77 (skip) without one.
set -euo pipefail
loom=$1 backend=$2 steps=$3 tol=$4
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
recipe=$here/recipes/cuda_train.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive

"$loom" run "$recipe" backend=cpu steps=3 model.layers=2 model.dim=48 checkpoint.dir="$tmp/teach" \
  checkpoint.every=3 > /dev/null
kd="teacher={checkpoint=\"$tmp/teach\",temperature=2,alpha=0.7}"
if ! "$loom" run "$recipe" backend="$backend" steps="$steps" "$kd" > "$tmp/dev" 2> "$tmp/dev.err"; then
  if grep -q "not usable here\|no CUDA device" "$tmp/dev.err"; then
    echo "SKIP: no GPU here, backend=$backend did not train: $(head -1 "$tmp/dev.err")"
    exit 77
  fi
  cat "$tmp/dev.err"; exit 1
fi
"$loom" run "$recipe" backend=cpu steps="$steps" "$kd" > "$tmp/cpu"
runs_close "backend=$backend vs cpu, distilled (T = 2, alpha = 0.7)" "$tmp/cpu" "$tmp/dev" "$steps" \
  "$tol" || exit 1
"$loom" run "$recipe" backend="$backend" steps="$steps" > "$tmp/plain"
d=$(max_loss_diff "$tmp/plain" "$tmp/dev")
below 0.1 "$d" || { echo "backend=$backend: distilled losses within $d of the undistilled run's"; exit 1; }
echo "backend=$backend: the distilled losses differ from the undistilled run's by up to $d"

# a llama teacher (2 blocks, dim 48, GQA) and a MoE teacher (4 experts, top-2) to the GPT-2
# student, so that only the teacher's forward runs their ops (RoPE, RMSNorm, SwiGLU; the
# router's rows ops): against the CPU's distilled run, and not the undistilled losses
"$loom" run "$here/recipes/cuda_train_llama.lua" backend=cpu steps=3 model.layers=2 model.dim=48 \
  model.ffn_dim=96 checkpoint.dir="$tmp/llama" checkpoint.every=3 > /dev/null
"$loom" run "$recipe" backend=cpu steps=3 model.layers=2 model.dim=48 model.moe.experts=4 \
  model.moe.top_k=2 checkpoint.dir="$tmp/MoE" checkpoint.every=3 > /dev/null
for name in llama MoE; do
  fam="teacher={checkpoint=\"$tmp/$name\",temperature=2,alpha=0.7}"
  "$loom" run "$recipe" backend="$backend" steps="$steps" "$fam" > "$tmp/fdev" 2>&1 ||
    { echo "backend=$backend, a $name teacher:"; cat "$tmp/fdev"; exit 1; }
  "$loom" run "$recipe" backend=cpu steps="$steps" "$fam" > "$tmp/fcpu"
  runs_close "backend=$backend vs cpu, distilled from a $name teacher" "$tmp/fcpu" "$tmp/fdev" \
    "$steps" "$tol" || exit 1
  d=$(max_loss_diff "$tmp/plain" "$tmp/fdev")
  below 0.1 "$d" || { echo "backend=$backend: a $name teacher's losses within $d of the undistilled run's"; exit 1; }
  echo "backend=$backend: a $name teacher: the losses differ from the undistilled run's by up to $d"
done

# the hidden-state and attention terms on block 0 against the teacher's block 1
terms="teacher={checkpoint=\"$tmp/teach\",temperature=2,alpha=0.7,layers={[0]=1},hidden=1,attention=10}"
"$loom" run "$recipe" backend="$backend" steps="$steps" "$terms" > "$tmp/tdev"
"$loom" run "$recipe" backend=cpu steps="$steps" "$terms" > "$tmp/tcpu"
runs_close "backend=$backend vs cpu, distilled with teacher.layers, hidden and attention" "$tmp/tcpu" \
  "$tmp/tdev" "$steps" "$tol" || exit 1
d=$(max_loss_diff "$tmp/dev" "$tmp/tdev")
below 1e-5 "$d" || { echo "backend=$backend: the terms' losses within $d of the logit term's alone"; exit 1; }
echo "backend=$backend: with the intermediate terms the losses differ from the logit term's alone by up to $d"

# teacher = student (its device checkpoint at step 2, resumed), T = 1, alpha = 1: KL 0 exactly
"$loom" run "$recipe" backend="$backend" steps=2 checkpoint.dir="$tmp/self" checkpoint.every=2 > /dev/null
"$loom" run "$recipe" backend="$backend" steps=3 resume="$tmp/self/step_00000002" \
  "teacher={checkpoint=\"$tmp/self/step_00000002\",temperature=1,alpha=1}" > "$tmp/self.out"
grep -q '^LOSS 3 0x0p+0 0.000000000$' "$tmp/self.out" ||
  { echo "backend=$backend, teacher = student (T = 1, alpha = 1): step 3's loss is not 0"; grep LOSS "$tmp/self.out"; exit 1; }
echo "backend=$backend: teacher = student (T = 1, alpha = 1): step 3's loss exactly 0"

# distill-cache written on the device, k = vocab: the cached run is the in-process run's bits
"$loom" distill-cache "$recipe" --out "$tmp/t.kdc" --k 256 backend="$backend" steps="$steps" "$kd" \
  > /dev/null 2> "$tmp/kdc.err" || { cat "$tmp/kdc.err"; exit 1; }
"$loom" run "$recipe" backend="$backend" steps="$steps" \
  "teacher={cache=\"$tmp/t.kdc\",temperature=2,alpha=0.7}" > "$tmp/cached"
grep '^LOSS\|^NORM' "$tmp/dev" > "$tmp/want"
grep '^LOSS\|^NORM' "$tmp/cached" > "$tmp/got" || true
[[ $(grep -c '^LOSS' "$tmp/got") -eq $steps ]] && cmp -s "$tmp/want" "$tmp/got" ||
  { echo "backend=$backend: the k = vocab cache's run is not the in-process teacher's bits:"; diff "$tmp/want" "$tmp/got"; exit 1; }
echo "backend=$backend: distill-cache (k = vocab) written and read there: bitwise the in-process teacher"

# canonical mode, all three terms, on a 2-block student (block 1 against the teacher's
# block 1): dp = 2 (each rank its own teacher, its own micro-batch) and pp = 2 (1f1b; the
# teacher on the last stage) bitwise one device rank
pterms="teacher={checkpoint=\"$tmp/teach\",temperature=2,alpha=0.7,layers={[1]=1},hidden=1,attention=10}"
pargs=(backend="$backend" steps="$steps" model.layers=2 batch.micro=1 batch.global=2 deterministic=canonical "$pterms")
"$loom" run "$recipe" "${pargs[@]}" > "$tmp/one"
grep '^LOSS\|^NORM' "$tmp/one" > "$tmp/want"
cp "$tmp/want" "$tmp/pwant" # also beside mesh.tp, below
[[ $(grep -c '^LOSS' "$tmp/want") -eq $steps ]] && finite_losses "$tmp/want" ||
  { echo "one rank, 2 blocks, canonical, distilled: not $steps finite losses"; cat "$tmp/one"; exit 1; }
for layout in "mesh.dp=2" "mesh.pp=2 microbatches=2 schedule=1f1b" \
              "mesh.pp=2 microbatches=2 schedule=1f1b teacher.pp=2"; do
  read -ra lay <<< "$layout"
  "$loom" launch -n 2 "$recipe" "${pargs[@]}" comm=shm "${lay[@]}" > "$tmp/two" 2> "$tmp/two.err" ||
    { cat "$tmp/two.err"; exit 1; }
  grep '^LOSS\|^NORM' "$tmp/two" > "$tmp/got" || true
  cmp -s "$tmp/want" "$tmp/got" ||
    { echo "backend=$backend: canonical distilled $layout is not bitwise one rank:"; diff "$tmp/want" "$tmp/got"; exit 1; }
  echo "backend=$backend: canonical distilled $layout (all three terms) bitwise one rank over $steps steps"
done

# teacher.attention beside the fused attention (LOOM_CUDA_ATTENTION=flash, fast mode; a
# teacher of ctx 32 trained on the CPU, a 2-block student at seq 32, where the fused kernels
# take the call: NH T >= NH + C): the mapped blocks (student block 1, teacher block 1) keep
# their probabilities on the batched path (backend.h attention_allow_fused), block 0 of
# each stays fused. Within TOL of the batched run and of the CPU's; not the batched run's
# bits (block 0 ran fused); the banner still says flash; fewer activation bytes than the
# batched run, the student's (ACT) and the teacher's (TACT); recompute = selective and full
# the same bits as none (the mapped block's probabilities recomputed on the batched path).
if [[ $backend == cudaemu || $backend == cuda ]]; then
  "$loom" run "$recipe" backend=cpu steps=3 model.layers=2 model.dim=48 model.ctx=32 \
    checkpoint.dir="$tmp/teach32" checkpoint.every=3 > /dev/null
  fterms="teacher={checkpoint=\"$tmp/teach32\",temperature=2,alpha=0.7,layers={[1]=1},hidden=1,attention=10}"
  fargs=(steps="$steps" model.layers=2 model.ctx=32 batch.seq=32 "$fterms")
  LOOM_CUDA_ATTENTION=flash "$loom" run "$recipe" backend="$backend" "${fargs[@]}" > "$tmp/fl" 2>&1 ||
    { echo "backend=$backend, teacher.attention with LOOM_CUDA_ATTENTION=flash:"; cat "$tmp/fl"; exit 1; }
  "$loom" run "$recipe" backend="$backend" "${fargs[@]}" > "$tmp/flb"
  "$loom" run "$recipe" backend=cpu "${fargs[@]}" > "$tmp/flc"
  grep -q "attention flash" "$tmp/fl" ||
    { echo "backend=$backend, LOOM_CUDA_ATTENTION=flash: the banner does not say attention flash"; head -3 "$tmp/fl"; exit 1; }
  runs_close "backend=$backend flash vs batched, teacher.attention" "$tmp/flb" "$tmp/fl" "$steps" "$tol" || exit 1
  runs_close "backend=$backend flash vs cpu, teacher.attention" "$tmp/flc" "$tmp/fl" "$steps" "$tol" || exit 1
  grep '^LOSS\|^NORM' "$tmp/fl" > "$tmp/want"
  grep '^LOSS\|^NORM' "$tmp/flb" > "$tmp/got"
  ! cmp -s "$tmp/want" "$tmp/got" ||
    { echo "backend=$backend, LOOM_CUDA_ATTENTION=flash: the batched run's bits (no block ran fused)"; exit 1; }
  for tag in ACT TACT; do
    read -r _ bf <<< "$(grep "^$tag " "$tmp/fl")"; read -r _ bb <<< "$(grep "^$tag " "$tmp/flb")"
    [[ -n $bf && -n $bb ]] && (( bf < bb )) ||
      { echo "backend=$backend, teacher.attention: $tag flash ${bf:-none} not below batched ${bb:-none}"; exit 1; }
    echo "backend=$backend: teacher.attention with flash: $tag $bf bytes, batched $bb"
  done
  for rc in selective full; do
    LOOM_CUDA_ATTENTION=flash "$loom" run "$recipe" backend="$backend" "${fargs[@]}" recompute=$rc > "$tmp/flr"
    grep '^LOSS\|^NORM' "$tmp/flr" > "$tmp/got" || true
    cmp -s "$tmp/want" "$tmp/got" ||
      { echo "backend=$backend, teacher.attention with flash, recompute=$rc: not recompute=none's bits"; diff "$tmp/want" "$tmp/got"; exit 1; }
  done
  echo "backend=$backend: teacher.attention with flash, recompute=selective and full: recompute=none's bits"
fi
# the logit term beside mesh.tp (the vocabulary columns gathered over the device tp group and
# laid out as whole rows by rows_gather, gpt_distill_tp_device.c), the teacher split over the
# same group (teacher.tp = 2: its columns gathered the same way; a replicated teacher is
# that run's student side alone, checked by hand) or across the dp ranks (kd_group.c, its
# group split from the device dp group): canonical tp = 2 and dp = 2 bitwise one device
# rank (the intermediate terms there: below)
targs=(backend="$backend" steps="$steps" batch.micro=1 batch.global=2 deterministic=canonical)
"$loom" run "$recipe" "${targs[@]}" "$kd" > "$tmp/one"
grep '^LOSS\|^NORM' "$tmp/one" > "$tmp/want"
cp "$tmp/want" "$tmp/logit1" # canonical, one rank, the logit term alone (also below)
tkd="teacher={checkpoint=\"$tmp/teach\",temperature=2,alpha=0.7,tp=2}"
for mesh in mesh.tp=2 mesh.dp=2; do # teacher.tp = 2 over the student's tp group, or across dp
  "$loom" launch -n 2 "$recipe" "${targs[@]}" "$tkd" comm=shm "$mesh" > "$tmp/two" 2> "$tmp/two.err" ||
    { cat "$tmp/two.err"; exit 1; }
  grep '^LOSS\|^NORM' "$tmp/two" > "$tmp/got" || true
  [[ $(grep -c '^LOSS' "$tmp/want") -eq $steps ]] && cmp -s "$tmp/want" "$tmp/got" ||
    { echo "backend=$backend: canonical distilled $mesh, teacher.tp=2 is not bitwise one rank:"; diff "$tmp/want" "$tmp/got"; exit 1; }
  echo "backend=$backend: canonical distilled $mesh, teacher.tp=2 (the logit term) bitwise one rank over $steps steps"
done
# beside mesh.ep: a MoE student (4 experts, top-2), canonical dp = 2 x ep = 2 (each rank its
# own teacher on its own micro-batch; the token rows exchanged over the device ep group):
# one device rank's bits
eargs=(backend="$backend" steps="$steps" model.moe.experts=4 model.moe.top_k=2 batch.micro=1
       batch.global=2 deterministic=canonical "$kd")
"$loom" run "$recipe" "${eargs[@]}" > "$tmp/one"
grep '^LOSS\|^NORM' "$tmp/one" > "$tmp/want"
"$loom" launch -n 2 "$recipe" "${eargs[@]}" comm=shm mesh.dp=2 mesh.ep=2 comm_timeout=20 > "$tmp/two" \
  2> "$tmp/two.err" || { cat "$tmp/two.err"; exit 1; }
grep '^LOSS\|^NORM' "$tmp/two" > "$tmp/got" || true
[[ $(grep -c '^LOSS' "$tmp/want") -eq $steps ]] && cmp -s "$tmp/want" "$tmp/got" ||
  { echo "backend=$backend: canonical distilled MoE dp=2 ep=2 is not bitwise one rank:"; diff "$tmp/want" "$tmp/got"; exit 1; }
echo "backend=$backend: canonical distilled MoE mesh.dp=2 mesh.ep=2 (the logit term) bitwise one rank over $steps steps"
if "$loom" launch -n 2 "$recipe" backend="$backend" steps=1 comm=shm mesh.dp=2 batch.micro=1 \
    batch.global=2 "teacher={checkpoint=\"$tmp/teach\",tp=2,layers={[0]=1}}" > "$tmp/tp" 2>&1; then
  echo "backend=$backend, teacher.layers with teacher.tp across dp ranks: accepted"; exit 1
fi
grep -q "teacher.layers with teacher.tp across dp ranks" "$tmp/tp" ||
  { echo "backend=$backend, teacher.layers with teacher.tp across dp ranks: unexpected message:"; cat "$tmp/tp"; exit 1; }
echo "backend=$backend: teacher.layers with teacher.tp across dp ranks refused by name"
# the intermediate terms beside mesh.tp (gpt_distill_hidden.c / _attn.c on the host over
# copies, as at tp = 1; under sequence parallelism h's rows gathered over the device tp
# group, then copied; the attention term's per-head row sums gathered there, copied both
# ways). Fast, both terms, the teacher replicated: within TOL of the CPU's tp = 2 run and of
# the device's tp = 1 run (tdev). Canonical, the hidden term alone and the attention term
# alone (the teacher replicated: each rank its heads' slice; the 1-block student) and all
# three terms (the 2-block student of pargs, teacher.tp = 2, sequence parallelism): tp = 2
# gives the device's tp = 1 bits, as the CPU's does (distill_hidden.sh). With LOOM_CUDA_ATTENTION=flash (block 0 fused): within TOL of the
# device's tp = 1 flash run (fl) and of the CPU's tp = 2 run.
"$loom" launch -n 2 "$recipe" backend="$backend" steps="$steps" comm=shm mesh.tp=2 "$terms" > "$tmp/tp" 2>&1 ||
  { echo "backend=$backend, teacher.layers beside mesh.tp:"; cat "$tmp/tp"; exit 1; }
"$loom" launch -n 2 "$recipe" backend=cpu steps="$steps" comm=shm mesh.tp=2 "$terms" > "$tmp/tpc"
runs_close "backend=$backend vs cpu, tp=2, both terms" "$tmp/tpc" "$tmp/tp" "$steps" "$tol" || exit 1
runs_close "backend=$backend tp=2 vs tp=1, both terms" "$tmp/tdev" "$tmp/tp" "$steps" "$tol" || exit 1
# tp_canon WANT LABEL ARGS...: canonical mesh.tp = 2 with ARGS gives WANT's bits
tp_canon() {
  "$loom" launch -n 2 "$recipe" "${@:3}" comm=shm mesh.tp=2 > "$tmp/two" 2> "$tmp/two.err" ||
    { cat "$tmp/two.err"; exit 1; }
  grep '^LOSS\|^NORM' "$tmp/two" > "$tmp/got" || true
  [[ $(grep -c '^LOSS' "$1") -eq $steps ]] && cmp -s "$1" "$tmp/got" ||
    { echo "backend=$backend: canonical mesh.tp=2, $2, is not bitwise one rank:"; diff "$1" "$tmp/got"; exit 1; }
  echo "backend=$backend: canonical mesh.tp=2, $2: bitwise one rank over $steps steps"
}
for t in "hidden=1" "hidden=0,attention=10"; do # the 1-block student, block 0 against 1
  tk="teacher={checkpoint=\"$tmp/teach\",temperature=2,alpha=0.7,layers={[0]=1},$t}"
  "$loom" run "$recipe" "${targs[@]}" "$tk" > "$tmp/one"
  grep '^LOSS\|^NORM' "$tmp/one" > "$tmp/want"
  cmp -s "$tmp/want" "$tmp/logit1" &&
    { echo "backend=$backend, canonical teacher.layers $t: the logit term's bits (no term ran)"; exit 1; }
  tp_canon "$tmp/want" "teacher.layers $t, the teacher replicated" "${targs[@]}" "$tk"
done
# all three terms on the 2-block student (pargs, its one-rank run above), teacher.tp = 2,
# sequence parallelism (res3's rows gathered on the device)
tp_canon "$tmp/pwant" "all three terms, teacher.tp=2, tp_sequence_parallel" "${pargs[@]}" \
  teacher.tp=2 tp_sequence_parallel=true
if [[ $backend == cudaemu || $backend == cuda ]]; then
  LOOM_CUDA_ATTENTION=flash "$loom" launch -n 2 "$recipe" backend="$backend" "${fargs[@]}" comm=shm \
    mesh.tp=2 > "$tmp/flt" 2>&1 || { echo "backend=$backend, flash, mesh.tp=2:"; cat "$tmp/flt"; exit 1; }
  grep -q "attention flash" "$tmp/flt" ||
    { echo "backend=$backend, LOOM_CUDA_ATTENTION=flash, mesh.tp=2: the banner does not say attention flash"; exit 1; }
  "$loom" launch -n 2 "$recipe" backend=cpu "${fargs[@]}" comm=shm mesh.tp=2 > "$tmp/fltc"
  runs_close "backend=$backend flash tp=2 vs tp=1, both terms" "$tmp/fl" "$tmp/flt" "$steps" "$tol" || exit 1
  runs_close "backend=$backend flash tp=2 vs cpu tp=2, both terms" "$tmp/fltc" "$tmp/flt" "$steps" "$tol" || exit 1
fi
