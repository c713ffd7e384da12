#!/usr/bin/env bash
# cuda_dp.sh LOOM BACKEND COMM STEPS TOL — data and tensor parallelism in a device backend's
# memory (recipes/cuda_train.lua), two ranks through `loom launch`, against one rank on the
# same backend with the same global batch (2 sequences a step: 2 micro-batches of 1 on one
# rank, 1 on each of two dp ranks, 2 of 1 on each tp rank):
#  - canonical mode: dp=2's losses and norms bitwise one rank's (the gathered gradients go
#    through the device groups, the losses through the host groups: dist.h);
#  - fast mode: dp=2 (the dp strategy's buckets all-reduced over the device groups) within
#    TOL of one rank, and the loss falls;
#  - the banner names what carries the device buffers (COMM=nccl: "nccl on the backend's
#    stream"; a host COMM: "staged through host memory");
#  - tensor parallelism (the tp strategy's region exchanges on the device groups, the
#    vocabulary-parallel loss, the split gradient norm): canonical tp=2 with sequence
#    parallelism and canonical tp=2 x dp=2 (four ranks) bitwise one rank; fast tp=2, with
#    and without sequence parallelism, within TOL;
#  - saved by both ranks at step STEPS-2 under offload=host (its steps bitwise dp=2's without)
#    and resumed on two without offload: the last two steps bitwise;
#  - what does not train in device memory yet (mesh.pp = 2 here) is refused by name.
# BACKEND cudaemu (the CUDA kernels emulated on the CPU; meson runs it under
# LOOM_CUDAEMU_GUARD=1, so a device buffer handed to the host communicator, or any host read
# of one, is a segfault) runs everywhere with COMM=shm. BACKEND cuda needs a GPU, and
# COMM=nccl one GPU per rank (NCCL refuses two ranks on one device): exit 77 (meson's skip)
# with a message otherwise.
set -euo pipefail
loom=$1 backend=$2 comm=$3 steps=$4 tol=$5
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
recipe=$here/recipes/cuda_train.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
args=(backend="$backend" steps="$steps" batch.micro=1 batch.global=2)

gpus() { nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true; }
if [[ $comm == nccl && $(gpus) -lt 2 ]]; then
  echo "SKIP: comm=nccl with 2 ranks needs 2 GPUs (NCCL takes one device per rank); $(gpus) visible"
  exit 77
fi

if ! "$loom" run "$recipe" "${args[@]}" deterministic=canonical > "$tmp/one" 2> "$tmp/one.err"; then
  if grep -q "not usable here\|no CUDA device" "$tmp/one.err"; then
    echo "SKIP: no GPU here, backend=$backend did not train: $(head -1 "$tmp/one.err")"
    exit 77
  fi
  cat "$tmp/one.err"; exit 1
fi
"$loom" launch -n 2 "$recipe" "${args[@]}" comm="$comm" mesh.dp=2 deterministic=canonical \
  > "$tmp/dp_c" 2> "$tmp/dp_c.err" || { cat "$tmp/dp_c.err"; exit 1; }
grep '^LOSS\|^NORM' "$tmp/one" > "$tmp/want"
grep '^LOSS\|^NORM' "$tmp/dp_c" > "$tmp/got" || true
[[ $(grep -c '^LOSS' "$tmp/want") -eq $steps ]] || { echo "one rank: not $steps losses"; cat "$tmp/one"; exit 1; }
cmp -s "$tmp/want" "$tmp/got" ||
  { echo "canonical dp=2 on $backend over $comm is not bitwise one rank:"; diff "$tmp/want" "$tmp/got"; exit 1; }
echo "backend=$backend comm=$comm: canonical dp=2 bitwise one rank over $steps steps (losses and norms)"

"$loom" launch -n 2 "$recipe" "${args[@]}" comm="$comm" mesh.dp=2 > "$tmp/dp" 2> "$tmp/dp.err" ||
  { cat "$tmp/dp.err"; exit 1; }
runs_close "backend=$backend comm=$comm: dp=2 vs one rank" "$tmp/one" "$tmp/dp" "$steps" "$tol" || exit 1
fell=$(loss_fell "$tmp/dp" 0.05) || { echo "dp=2: the loss did not fall: $fell"; exit 1; }
want_banner=$([[ $comm == nccl ]] && echo "device buffers over nccl on the backend's stream" ||
              echo "device buffers over $comm, staged through host memory")
grep -q "$want_banner" "$tmp/dp" || { echo "banner does not say: $want_banner"; head -1 "$tmp/dp"; exit 1; }
echo "backend=$backend comm=$comm: loss $fell; banner: $want_banner"

# tensor parallelism: canonical mode's tree over ranks runs on the backend's ops, so the
# layouts give one rank's bits; fast mode's sums are the communicator's
same_as_one() { # NAME FILE: FILE's losses and norms bitwise the one-rank run's
  grep '^LOSS\|^NORM' "$2" > "$tmp/got" || true
  cmp -s "$tmp/want1" "$tmp/got" ||
    { echo "$1 on $backend over $comm is not bitwise one rank:"; diff "$tmp/want1" "$tmp/got"; exit 1; }
  echo "backend=$backend comm=$comm: $1 bitwise one rank over $steps steps (losses and norms)"
}
grep '^LOSS\|^NORM' "$tmp/one" > "$tmp/want1"
tp_run() { # OUT ARGS...: two ranks at tp=2
  local out=$1; shift
  "$loom" launch -n 2 "$recipe" "${args[@]}" comm="$comm" mesh.tp=2 "$@" > "$out" 2> "$out.err" ||
    { cat "$out.err"; exit 1; }
}
tp_run "$tmp/tp_sp_c" tp_sequence_parallel=true deterministic=canonical
same_as_one "canonical tp=2 with sequence parallelism" "$tmp/tp_sp_c"
if [[ $comm == nccl && $(gpus) -lt 4 ]]; then
  echo "backend=$backend comm=nccl: tp=2 x dp=2 not run: it needs 4 GPUs (one a rank); $(gpus) visible"
else
  "$loom" launch -n 4 "$recipe" "${args[@]}" comm="$comm" mesh.tp=2 mesh.dp=2 \
    deterministic=canonical > "$tmp/tpdp_c" 2> "$tmp/tpdp_c.err" || { cat "$tmp/tpdp_c.err"; exit 1; }
  same_as_one "canonical tp=2 x dp=2" "$tmp/tpdp_c"
fi
tp_run "$tmp/tp"
runs_close "backend=$backend comm=$comm: tp=2 vs one rank" "$tmp/one" "$tmp/tp" "$steps" "$tol" || exit 1
tp_run "$tmp/tp_sp" tp_sequence_parallel=true
runs_close "backend=$backend comm=$comm: tp=2 with sequence parallelism vs one rank" "$tmp/one" \
  "$tmp/tp_sp" "$steps" "$tol" || exit 1
grep -q "x2 tp+sp | .*$want_banner" "$tmp/tp_sp" ||
  { echo "tp=2 banner does not say x2 tp+sp and: $want_banner"; head -1 "$tmp/tp_sp"; exit 1; }

# a checkpoint saved by both ranks at step k and resumed on two ranks: the two later steps
# bitwise the straight run's (the second shows the optimizer state; save and load go through
# the host mirrors and the host groups). The saving run offloads the optimizer to the host
# (core/train/offload_device.c, chunk_mb = 0.01: many chunks) and runs on to STEPS, bitwise
# the straight run's every step, and the resume without offload reads the pool's state as saved.
k=$((steps - 2))
"$loom" launch -n 2 "$recipe" "${args[@]}" comm="$comm" mesh.dp=2 \
  strategy.offload.optimizer=host strategy.offload.chunk_mb=0.01 \
  checkpoint.dir="$tmp/ck" checkpoint.every=$k > "$tmp/save" 2> "$tmp/save.err" || { cat "$tmp/save.err"; exit 1; }
grep -q "optimizer offloaded (host)" "$tmp/save" || { echo "dp=2 offload: not offloaded"; head -3 "$tmp/save"; exit 1; }
grep '^LOSS\|^NORM' "$tmp/dp" > "$tmp/want"
grep '^LOSS\|^NORM' "$tmp/save" > "$tmp/got" || true
[[ -s "$tmp/want" ]] && cmp -s "$tmp/want" "$tmp/got" ||
  { echo "dp=2 with offload=host differs from dp=2:"; diff "$tmp/want" "$tmp/got"; exit 1; }
echo "backend=$backend comm=$comm: dp=2 with offload=host, $steps steps bitwise dp=2 without"
"$loom" launch -n 2 "$recipe" "${args[@]}" comm="$comm" mesh.dp=2 checkpoint.dir="$tmp/ck" \
  resume="$tmp/ck/$(printf step_%08d $k)" > "$tmp/res" 2> "$tmp/res.err" || { cat "$tmp/res.err"; exit 1; }
grep -q "resumed from .*step_0*$k at step $k" "$tmp/res" ||
  { echo "dp=2 did not resume at step $k"; cat "$tmp/res"; exit 1; }
awk -v k=$k '/^LOSS/ && $2 > k' "$tmp/dp" > "$tmp/want"
grep '^LOSS' "$tmp/res" > "$tmp/got" || true
[[ -s "$tmp/want" ]] && cmp -s "$tmp/want" "$tmp/got" ||
  { echo "dp=2 resumed losses differ:"; diff "$tmp/want" "$tmp/got"; exit 1; }
echo "backend=$backend comm=$comm: dp=2 saved at step $k and resumed, steps $((k + 1))-$steps bitwise the straight run"

if out=$("$loom" launch -n 2 "$recipe" "${args[@]}" comm="$comm" mesh.pp=2 model.layers=2 2>&1); then
  echo "backend=$backend with mesh.pp=2: accepted"; exit 1
fi
grep -q "training in device memory with mesh.pp > 1 .* is not built yet" <<< "$out" ||
  { echo "backend=$backend with mesh.pp=2: unexpected message: $out"; exit 1; }
echo "backend=$backend: mesh.pp=2 refused with a message"
