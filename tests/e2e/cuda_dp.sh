#!/usr/bin/env bash
# cuda_dp.sh LOOM BACKEND COMM STEPS TOL — data and tensor parallelism in a device backend's
# memory (recipes/cuda_train.lua), two ranks through `loom launch`, against one rank on the
# same backend with the same global batch (2 sequences a step: 2 micro-batches of 1 on one
# rank, 1 on each of two dp ranks, 2 of 1 on each tp rank):
#  - canonical mode: dp=2's losses and norms bitwise one rank's (the gathered gradients go
#    through the device groups, the losses through the host groups: dist.h);
#  - fast mode: dp=2 (the dp strategy's buckets all-reduced over the device groups) within
#    TOL of one rank, and the loss falls;
#  - fast dp=2 with strategy.compress (topk, onebit; host-staged) within a tolerance of the
#    CPU backend's dp=2 with the same compression, onebit saved and resumed bitwise; topk
#    beside tp=2 and pp=2 (x dp=2) and dp=4 ep=2 within TOL of the CPU's same layout; canonical onebit at
#    dp=2, tp=2, pp=2 and zero=3 bitwise one rank's, topk ratio 1 bitwise uncompressed;
#    fast topk beside zero=1 (bitwise plain dp's), 2 and 3 (within TOL of the CPU's);
#    1-bit Adam (topk) fast dp=2 and canonical one rank within TOL of the CPU's, canonical
#    dp=2 bitwise one rank's; canonical powersgd dp=2 bitwise one rank's;
#  - the banner names what carries the device buffers (COMM=nccl: "nccl on the backend's
#    stream"; a host COMM: "staged through host memory");
#  - tensor parallelism (the tp strategy's region exchanges on the device groups, the
#    vocabulary-parallel loss, the split gradient norm): canonical tp=2 with sequence
#    parallelism and canonical tp=2 x dp=2 (four ranks) bitwise one rank; fast tp=2, with
#    and without sequence parallelism, within TOL;
#  - saved by both ranks at step STEPS-2 under offload=host (its steps bitwise dp=2's without)
#    and resumed on two without offload: the last two steps bitwise;
#  - ZeRO (strategy.zero = 1, 2, 3) at dp=2: the state partition (stage 2: the gradient
#    partition, stage 3: the parameter partition too) in the backend's memory, the buckets
#    reduce-scattered and the parameters all-gathered (stage 3: unit by unit, before use)
#    over the device groups: canonical zero=3 bitwise one rank; fast zero=1 bitwise fast
#    plain dp (the same all-reduce, an element-wise update); fast zero=2 and 3 within TOL
#    of one rank; the bytes by category; zero=3 saved at step STEPS-2 and resumed: the last
#    two steps bitwise; zero=2 and 3 on sparse model buffers (the backend's vm ops) bitwise
#    whole allocations (LOOM_ZERO_SPARSE=0); at 6 blocks their committed peaks well under;
#  - pp=2 (one block a stage, 2 micro-batches of 1) against one rank of the same 2-block
#    model: canonical 1f1b (STEPS steps) and zb1 (STEPS-1) bitwise (losses and norms), 1f1b
#    saved at step STEPS-2 and resumed on two, bitwise; fast 1f1b over STEPS-1 steps within
#    TOL of one rank's fast run, the loss falling. zb1 and the fast run post each run of
#    transfers as one group (LOOM_PP_GROUPED=1; nccl's path, automatic there).
#  - expert parallelism (dp=2 ep=2, a MoE block; beside ZeRO, in fp32 and bf16, pp=2 and tp=2): see its
#    sections at the end;
#  - ZeRO with bf16 weights, offload beside ZeRO, reduce = "bf16" and offload.params = true
#    (zero=3's partition in the offload): see their blocks after pp's.
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

resumed_bitwise() { # NAME RESUMED STRAIGHT: RESUMED resumed at step k, and its later steps'
  # losses and norms are bitwise STRAIGHT's
  grep -q "resumed from .*step_0*$k at step $k" "$2" || { echo "$1 did not resume at step $k"; cat "$2"; exit 1; }
  awk -v k=$k '(/^LOSS/ || /^NORM/) && $2 > k' "$3" > "$tmp/want"
  grep '^LOSS\|^NORM' "$2" > "$tmp/got" || true
  [[ -s "$tmp/want" ]] && cmp -s "$tmp/want" "$tmp/got" ||
    { echo "$1, resumed at step $k: losses and norms differ:"; diff "$tmp/want" "$tmp/got"; exit 1; }
}

refused_2() { # NAME WANT ARGS...: a 2-rank launch with ARGS fails, its message matching WANT
  local name=$1 want=$2 out; shift 2
  if out=$("$loom" launch -n 2 "$recipe" comm="$comm" "$@" 2>&1); then
    echo "backend=$backend with $name: accepted"; exit 1
  fi
  grep -q "$want" <<< "$out" || { echo "backend=$backend with $name: unexpected message: $out"; exit 1; }
  echo "backend=$backend: $name refused with a message"
}

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

# gradient compression, host-staged (grad_sync.c's exchange_staged): each step's gradient
# copied to host memory, compressed, exchanged and decompressed by the host compressor, the
# sum copied back for the device optimizer; against the CPU backend's dp=2 with the same
# compression (fast mode: the only mode compressed in device memory). topk (ratio 0.1)
# within TOL; onebit within 1e-3 (or 10 TOL if larger): where the two backends' fp32 gradients part by an ulp an
# element near zero can change sign, which moves it by its bucket's scale (|g| ~ 1e-2 here;
# measured 2.1e-4 in the norms, 3.3e-6 in the losses over 3 steps)
for c in 'topk",ratio=0.1' 'onebit"'; do
  name=${c%%\"*}; ctol=$tol # onebit: 1e-3, or 10 TOL where that is larger (a GPU's run, never run)
  [[ $name == onebit ]] && ctol=$(awk -v t="$tol" 'BEGIN { print (10 * t > 1e-3 ? 10 * t : 1e-3) }')
  "$loom" launch -n 2 "$recipe" "${args[@]}" backend=cpu comm=shm mesh.dp=2 \
    "strategy.compress={\"$c}" > "$tmp/cz_cpu" 2> "$tmp/cz.err" || { cat "$tmp/cz.err"; exit 1; }
  "$loom" launch -n 2 "$recipe" "${args[@]}" comm="$comm" mesh.dp=2 "strategy.compress={\"$c}" \
    checkpoint.dir="$tmp/czck_$name" checkpoint.every=$((steps - 2)) > "$tmp/cz" 2> "$tmp/cz.err" ||
    { cat "$tmp/cz.err"; exit 1; }
  runs_close "backend=$backend comm=$comm: dp=2 compress=$name vs backend=cpu's" "$tmp/cz_cpu" \
    "$tmp/cz" "$steps" "$ctol" || exit 1
  [[ $name == topk ]] && cp "$tmp/cz_cpu" "$tmp/cz_topk_cpu" && cp "$tmp/cz" "$tmp/cz_topk"
done
# compression beside ZeRO (the exchanged whole; stages 2 and 3: each rank's partition taken
# out of it, loom_zero_take_reduced, the gradient buffer whole: zero.h's whole_grads), topk
# as above: zero=1 bitwise plain compressed dp=2 (losses and norms: the same exchange, an
# element-wise update), zero=2 its losses bitwise, zero=2 and 3 within TOL of the CPU's
# plain compressed dp=2
for z in 1 2 3; do
  "$loom" launch -n 2 "$recipe" "${args[@]}" comm="$comm" mesh.dp=2 strategy.zero=$z \
    'strategy.compress={"topk",ratio=0.1}' > "$tmp/czz$z" 2> "$tmp/cz.err" || { cat "$tmp/cz.err"; exit 1; }
done
cmp -s <(grep '^LOSS\|^NORM' "$tmp/cz_topk") <(grep '^LOSS\|^NORM' "$tmp/czz1") ||
  { echo "fast zero=1 dp=2 compress=topk on $backend is not bitwise plain dp=2's:"; diff "$tmp/cz_topk" "$tmp/czz1"; exit 1; }
cmp -s <(grep '^LOSS' "$tmp/cz_topk") <(grep '^LOSS' "$tmp/czz2") ||
  { echo "fast zero=2 dp=2 compress=topk on $backend: losses not bitwise plain dp=2's:"; diff "$tmp/cz_topk" "$tmp/czz2"; exit 1; }
echo "backend=$backend comm=$comm: zero=1 dp=2 compress=topk bitwise plain dp=2's; zero=2 its losses bitwise"
for z in 2 3; do
  runs_close "backend=$backend comm=$comm: zero=$z dp=2 compress=topk vs backend=cpu's plain dp=2" \
    "$tmp/cz_topk_cpu" "$tmp/czz$z" "$steps" "$tol" || exit 1
done
# onebit's save at step k (each rank's error-feedback residual, host memory, in
# residual.safetensors) resumed: the later steps bitwise
k=$((steps - 2))
"$loom" launch -n 2 "$recipe" "${args[@]}" comm="$comm" mesh.dp=2 'strategy.compress={"onebit"}' \
  resume="$tmp/czck_onebit/$(printf step_%08d $k)" > "$tmp/czres" 2> "$tmp/czres.err" || { cat "$tmp/czres.err"; exit 1; }
resumed_bitwise "dp=2 compress=onebit" "$tmp/czres" "$tmp/cz"
echo "backend=$backend comm=$comm: dp=2 compress=onebit saved at step $k and resumed, steps $((k + 1))-$steps bitwise"
# canonical compression in device memory (grad_sync.c's compress_input: each leaf packed
# from a host copy; each gathered leaf decoded on the host and copied to the backend for
# its tree): onebit at dp=2, tp=2 and pp=2 interleaved (each chunk's buckets as its
# backward ends: the ranges) bitwise one rank's onebit on this backend (losses and norms);
# topk ratio 1 at dp=2 bitwise the uncompressed one rank (every element sent: the same
# leaves in the same tree); powersgd (rank 2; its factors summed in the backend's trees
# through device copies, compress_powersgd_leaves.c's gather_tree) at dp=2 bitwise one rank's,
# one rank within TOL of the CPU backend's
cz1() { # FILE ARGS...: one rank, canonical
  local out=$1; shift
  "$loom" run "$recipe" "${args[@]}" deterministic=canonical "$@" > "$out" 2> "$out.err" || { cat "$out.err"; exit 1; }
}
czn() { # FILE ARGS...: two ranks, canonical
  local out=$1; shift
  "$loom" launch -n 2 "$recipe" "${args[@]}" comm="$comm" deterministic=canonical "$@" > "$out" 2> "$out.err" ||
    { cat "$out.err"; exit 1; }
}
bits_same() { # NAME WANT GOT
  [[ $(grep -c '^LOSS' "$2") -eq $steps ]] && cmp -s <(grep '^LOSS\|^NORM' "$2") <(grep '^LOSS\|^NORM' "$3") ||
    { echo "$1 on $backend over $comm is not bitwise:"; diff <(grep '^LOSS\|^NORM' "$2") <(grep '^LOSS\|^NORM' "$3"); exit 1; }
  echo "backend=$backend comm=$comm: $1 bitwise over $steps steps (losses and norms)"
}
ob='strategy.compress={"onebit"}'
cz1 "$tmp/cc1" "$ob"
czn "$tmp/ccdp" mesh.dp=2 "$ob"
bits_same "canonical dp=2 compress=onebit vs one rank's" "$tmp/cc1" "$tmp/ccdp"
czn "$tmp/cctp" mesh.tp=2 "$ob"
bits_same "canonical tp=2 compress=onebit vs one rank's" "$tmp/cc1" "$tmp/cctp"
cz1 "$tmp/cc14" model.layers=4 "$ob"
czn "$tmp/ccpp" model.layers=4 mesh.pp=2 microbatches=2 schedule=interleaved "$ob"
bits_same "canonical pp=2 interleaved (4 blocks) compress=onebit vs one rank's" "$tmp/cc14" "$tmp/ccpp"
czn "$tmp/ccz3" mesh.dp=2 strategy.zero=3 "$ob"
bits_same "canonical zero=3 dp=2 compress=onebit vs one rank's" "$tmp/cc1" "$tmp/ccz3"
czn "$tmp/cctk" mesh.dp=2 'strategy.compress={"topk",ratio=1}'
bits_same "canonical dp=2 compress=topk ratio 1 vs one rank uncompressed" "$tmp/one" "$tmp/cctk"
ps='strategy.compress={"powersgd",rank=2}'
cz1 "$tmp/cp1" "$ps"
czn "$tmp/cpdp" mesh.dp=2 "$ps"
bits_same "canonical dp=2 compress=powersgd vs one rank's" "$tmp/cp1" "$tmp/cpdp"
cz1 "$tmp/cp1_cpu" "$ps" backend=cpu # the sum landing in the gradient: against the CPU's
runs_close "backend=$backend: canonical powersgd one rank vs backend=cpu's" "$tmp/cp1_cpu" "$tmp/cp1" "$steps" "$tol" || exit 1
# 1-bit Adam in device memory (compress_momentum.c: adamw's m, the device's state, copied to
# the host each compressed step, loom_compress_momentum_pull; canonical: the summed leaves'
# momentum turned into the gradient through the host copy). topk 0.1, warm-up 2 steps of 4
# (a variance frozen after one step diverges here, on the CPU as well), lr 1e-3: fast dp=2
# within TOL of the CPU's fast dp=2; canonical dp=2 bitwise one rank's on this backend, and
# that one rank within TOL of the CPU's
mom=(steps=4 grad_clip=0 'optimizer={"adamw",lr=1e-3}' 'strategy.compress={"topk",ratio=0.1,warmup=2,momentum=true}')
for be in cpu "$backend"; do
  c=$([[ $be == cpu ]] && echo shm || echo "$comm")
  "$loom" launch -n 2 "$recipe" "${args[@]}" "${mom[@]}" backend=$be comm=$c mesh.dp=2 > "$tmp/cm_$be" \
    2> "$tmp/cz.err" || { cat "$tmp/cz.err"; exit 1; }
  "$loom" run "$recipe" "${args[@]}" "${mom[@]}" backend=$be deterministic=canonical > "$tmp/cm1_$be" \
    2> "$tmp/cz.err" || { cat "$tmp/cz.err"; exit 1; }
done
runs_close "backend=$backend comm=$comm: dp=2 1-bit Adam (topk) vs backend=cpu's" "$tmp/cm_cpu" "$tmp/cm_$backend" 4 "$tol" || exit 1
runs_close "backend=$backend: canonical 1-bit Adam (topk) one rank vs backend=cpu's" "$tmp/cm1_cpu" "$tmp/cm1_$backend" 4 "$tol" || exit 1
"$loom" launch -n 2 "$recipe" "${args[@]}" "${mom[@]}" comm="$comm" mesh.dp=2 deterministic=canonical > "$tmp/cm2" \
  2> "$tmp/cz.err" || { cat "$tmp/cz.err"; exit 1; }
cmp -s <(grep '^LOSS\|^NORM' "$tmp/cm1_$backend") <(grep '^LOSS\|^NORM' "$tmp/cm2") ||
  { echo "canonical dp=2 1-bit Adam on $backend is not bitwise one rank's:"; diff "$tmp/cm1_$backend" "$tmp/cm2"; exit 1; }
echo "backend=$backend comm=$comm: canonical dp=2 1-bit Adam (topk) bitwise one rank's over 4 steps"
# compression beside tp and pp (fast mode, the exchange over the dp group of each rank's
# own gradient: tp's shards, a stage's tensors; host-staged as above), four ranks each,
# against the CPU backend's same layout with the same compression: topk (ratio 0.1) within
# TOL. (The guard is the detector: a host read of a device buffer on these paths segfaults.)
if [[ $comm == nccl && $(gpus) -lt 4 ]]; then
  echo "backend=$backend comm=nccl: compression beside tp=2 and pp=2 not run: it needs 4 GPUs; $(gpus) visible"
else
  for lay in tp pp; do
    more=(mesh.tp=2); [[ $lay == pp ]] && more=(model.layers=2 mesh.pp=2 microbatches=2 schedule=1f1b batch.global=4)
    for be in cpu "$backend"; do
      c=$([[ $be == cpu ]] && echo shm || echo "$comm")
      "$loom" launch -n 4 "$recipe" "${args[@]}" backend=$be comm=$c mesh.dp=2 "${more[@]}" \
        'strategy.compress={"topk",ratio=0.1}' > "$tmp/cz_$lay$be" 2> "$tmp/cz.err" || { cat "$tmp/cz.err"; exit 1; }
    done
    runs_close "backend=$backend comm=$comm: $lay=2 x dp=2 compress=topk vs backend=cpu's" \
      "$tmp/cz_${lay}cpu" "$tmp/cz_$lay$backend" "$steps" "$tol" || exit 1
  done
  # beside ep: dp=4 ep=2 (the dense entries over dp, each expert over its edp group of 2,
  # loom_compress_add_experts), a MoE block, a global batch of 4
  for be in cpu "$backend"; do
    c=$([[ $be == cpu ]] && echo shm || echo "$comm")
    "$loom" launch -n 4 "$recipe" "${args[@]}" backend=$be comm=$c mesh.dp=4 mesh.ep=2 batch.global=4 \
      model.moe.experts=4 model.moe.top_k=2 'strategy.compress={"topk",ratio=0.1}' > "$tmp/cz_ep$be" 2> "$tmp/cz.err" ||
      { cat "$tmp/cz.err"; exit 1; }
  done
  runs_close "backend=$backend comm=$comm: dp=4 ep=2 compress=topk vs backend=cpu's" \
    "$tmp/cz_epcpu" "$tmp/cz_ep$backend" "$steps" "$tol" || exit 1
fi

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
# ZeRO in device memory (core/train/zero_device.c). At dim 48 the parameter count is an odd
# multiple of 16, so the buffer ends inside a tail bucket (zero.h), which goes through the
# tail staging; dim 32's does not. Canonical mode: zero=3, whose reduction is stage 1's
# there (zero.h: the fixed tree sums whole gradients), with the per-unit gathers.
zargs=("${args[@]}" model.dim=48)
"$loom" run "$recipe" "${zargs[@]}" deterministic=canonical > "$tmp/zone" 2> "$tmp/zone.err" ||
  { cat "$tmp/zone.err"; exit 1; }
"$loom" launch -n 2 "$recipe" "${zargs[@]}" comm="$comm" mesh.dp=2 strategy.zero=3 \
  deterministic=canonical > "$tmp/z_c" 2> "$tmp/z_c.err" || { cat "$tmp/z_c.err"; exit 1; }
grep '^LOSS\|^NORM' "$tmp/zone" > "$tmp/want"
grep '^LOSS\|^NORM' "$tmp/z_c" > "$tmp/got" || true
cmp -s "$tmp/want" "$tmp/got" ||
  { echo "canonical zero=3 dp=2 on $backend over $comm is not bitwise one rank:"; diff "$tmp/want" "$tmp/got"; exit 1; }
echo "backend=$backend comm=$comm: canonical zero=3 dp=2 dim 48 bitwise one rank over $steps steps"
# two steps: the second's loss reads the first update, which read the state partition
"$loom" launch -n 2 "$recipe" "${args[@]}" comm="$comm" mesh.dp=2 strategy.zero=1 steps=2 > "$tmp/z1" \
  2> "$tmp/z1.err" || { cat "$tmp/z1.err"; exit 1; }
awk '/^LOSS|^NORM/ && $2 <= 2' "$tmp/dp" > "$tmp/want"
grep '^LOSS\|^NORM' "$tmp/z1" > "$tmp/got" || true
cmp -s "$tmp/want" "$tmp/got" ||
  { echo "fast zero=1 dp=2 on $backend is not bitwise fast plain dp=2:"; diff "$tmp/want" "$tmp/got"; exit 1; }
echo "backend=$backend comm=$comm: fast zero=1 dp=2 bitwise fast plain dp=2 over 2 steps"

# memory by category on rank 0 (the session's accounting; adamw: 2 state floats a parameter;
# P: the parameter count padded to 16 x 2): plain dp's state 2 x 4 bytes a parameter,
# zero=1's 2 x 4 x P/2; zero=2 also the gradient partition, 4 x P/2, beside the model's
# gradient buffer, whose committed peak (grads_peak_resident) is its whole size at this one
# block (the embeddings' gradients, written first and reduced last, and the block's are
# all live at once); zero=3 also the parameter partition, 4 x P/2, beside the parameter
# buffer, whose peak (params_peak_resident) is whole too (every unit gathered in forward).
# At 6 blocks the peaks fall well under (below)
mem_ok() { # LABEL FILE ZERO
  awk -v z="$3" '/^MEM / { p = $3; g = $4; o = $5; pk = $7; pp = $8; n++ }
    END { if (!n) { print "no MEM line"; exit 1 }
          t = z == 3 ? pk / 4 : p / 4 # parameters (zero=3: the size of the gradient buffer)
          P = int((t + 31) / 32) * 32
          wp = z == 3 ? 4 * P / 2 : 4 * t; wg = z >= 2 ? 4 * P / 2 : 4 * t
          wo = z ? 2 * 4 * P / 2 : 2 * 4 * t; wk = z >= 2 ? 4 * t : 0; wq = z == 3 ? 4 * t : 0
          printf "params %d (want %d) grads %d (want %d) optimizer %d (want %d) peaks %d %d (want %d %d)\n", p, wp, g, wg, o, wo, pk, pp, wk, wq
          exit !(p == wp && g == wg && o == wo && pk == wk && pp == wq) }' "$2" > "$tmp/mem" ||
    { echo "$1 memory: $(cat "$tmp/mem")"; return 1; }
  echo "$1 memory: $(cat "$tmp/mem")"
}
mem_ok "backend=$backend dp=2" "$tmp/dp" 0 && mem_ok "backend=$backend zero=1 dp=2" "$tmp/z1" 1 || exit 1

# fast zero=2 and zero=3 at dim 48 against that one-rank run (small buckets: several
# reduce-scatters in flight during backward); zero=3 saves at step k on the way (a save
# changes nothing the run computes), then resumes from that save on two ranks
k=$((steps - 2))
for z in 2 3; do # zero=2: two steps, as zero=1 above
  more=(steps=2); n=2; [[ $z == 3 ]] && more=(checkpoint.dir="$tmp/zk" checkpoint.every=$k) n=$steps
  "$loom" launch -n 2 "$recipe" "${zargs[@]}" comm="$comm" mesh.dp=2 strategy.zero=$z \
    strategy.dp.bucket_mb=0.01 "${more[@]}" > "$tmp/z$z" 2> "$tmp/z$z.err" || { cat "$tmp/z$z.err"; exit 1; }
  awk -v n=$n '/^LOSS|^NORM/ && $2 <= n' "$tmp/zone" > "$tmp/zone_n"
  runs_close "backend=$backend comm=$comm: fast zero=$z dp=2 dim 48 vs one rank" "$tmp/zone_n" "$tmp/z$z" \
    "$n" "$tol" || exit 1
  mem_ok "backend=$backend zero=$z dp=2" "$tmp/z$z" $z || exit 1
  # the sparse model buffers (below) change no bit: the same run on whole allocations
  LOOM_ZERO_SPARSE=0 "$loom" launch -n 2 "$recipe" "${zargs[@]}" comm="$comm" mesh.dp=2 strategy.zero=$z \
    strategy.dp.bucket_mb=0.01 steps=$n > "$tmp/zw$z" 2> "$tmp/zw$z.err" || { cat "$tmp/zw$z.err"; exit 1; }
  grep '^LOSS\|^NORM' "$tmp/zw$z" > "$tmp/want"
  grep '^LOSS\|^NORM' "$tmp/z$z" > "$tmp/got" || true
  [[ $(grep -c '^LOSS' "$tmp/want") -eq $n ]] && cmp -s "$tmp/want" "$tmp/got" ||
    { echo "zero=$z on sparse buffers is not bitwise the whole allocations':"; diff "$tmp/want" "$tmp/got"; exit 1; }
  echo "backend=$backend comm=$comm: zero=$z dp=2 on sparse buffers bitwise whole allocations (LOOM_ZERO_SPARSE=0) over $n steps"
done
"$loom" launch -n 2 "$recipe" "${zargs[@]}" comm="$comm" mesh.dp=2 strategy.zero=3 strategy.dp.bucket_mb=0.01 \
  resume="$tmp/zk/step_$(printf %08d $k)" > "$tmp/zres" 2> "$tmp/zres.err" || { cat "$tmp/zres.err"; exit 1; }
resumed_bitwise "zero=3 dp=2" "$tmp/zres" "$tmp/z3"
echo "backend=$backend comm=$comm: zero=3 dp=2 saved at step $k (per-rank partitions) and resumed, steps $((k + 1))-$steps bitwise"

# Sparse model buffers (zero_sparse.c over the backend's vm ops; cudaemu: mmap, mprotect,
# madvise, committed memory reading NaN until written, decommitted memory PROT_NONE; bitwise
# whole allocations above): at 6 blocks, where the embeddings no longer fill the buffer, the
# committed peaks of one step on rank 0 are well under the whole buffer (4 x P bytes):
# gradients at most 1/3 of it under zero=2 (a bucket is reduced as backward passes it), at
# most 3/5 under zero=3 (its buckets are the units: the embeddings', a block computing and
# two in flight), parameters at most 1/2 (the embeddings and two blocks)
peaks() { # LABEL FILE ZERO
  awk -v z="$3" '/^MEM / { p = $3; pk = $7; pp = $8; n++ }
    END { if (!n) { print "no MEM line"; exit 1 }
          w = z == 3 ? 2 * p : p # the whole buffer (zero=3: twice the partition, padded)
          printf "grads peak %d, params peak %d of %d bytes\n", pk, pp, w
          exit !(pk > 0 && (z == 2 ? 3 * pk <= w && pp == 0 : 5 * pk <= 3 * w && pp > 0 && 2 * pp <= w)) }' \
    "$2" > "$tmp/peak" || { echo "$1: $(cat "$tmp/peak")"; return 1; }
  echo "$1: $(cat "$tmp/peak")"
}
for z in 2 3; do
  "$loom" launch -n 2 "$recipe" "${zargs[@]}" model.layers=6 steps=1 comm="$comm" mesh.dp=2 \
    strategy.zero=$z strategy.dp.bucket_mb=0.01 > "$tmp/s$z" 2> "$tmp/s$z.err" || { cat "$tmp/s$z.err"; exit 1; }
  peaks "backend=$backend zero=$z dp=2 6 blocks, sparse buffers" "$tmp/s$z" $z || exit 1
done

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
resumed_bitwise "dp=2" "$tmp/res" "$tmp/dp"
echo "backend=$backend comm=$comm: dp=2 saved at step $k and resumed, steps $((k + 1))-$steps bitwise the straight run"

# pipeline parallelism in device memory: pp=2, one block a stage, 2 micro-batches of 1 (the
# same global batch). The stage messages and the tied wte's halves go over the device groups
# (a host COMM: staged), the loss and the split norm over the host groups.
pp=(model.layers=2 mesh.pp=2 microbatches=2)
"$loom" run "$recipe" "${args[@]}" model.layers=2 deterministic=canonical > "$tmp/pp_one" \
  2> "$tmp/pp_one.err" || { cat "$tmp/pp_one.err"; exit 1; }
grep '^LOSS\|^NORM' "$tmp/pp_one" > "$tmp/pp_want"
[[ $(grep -c '^LOSS' "$tmp/pp_want") -eq $steps ]] || { echo "pp's one rank: not $steps losses"; exit 1; }
pp_same() { # NAME FILE [STEPS]: FILE's losses and norms bitwise one rank's (its first STEPS),
  # the banner saying pp
  grep -q "x2 pp (.*, blocks 1+1).*$want_banner" "$2" ||
    { echo "$1: the banner does not say pp=2 and: $want_banner"; head -1 "$2"; exit 1; }
  awk -v n="${3:-$steps}" '$2 <= n' "$tmp/pp_want" > "$tmp/want"
  grep '^LOSS\|^NORM' "$2" > "$tmp/got" || true
  cmp -s "$tmp/want" "$tmp/got" ||
    { echo "$1 on $backend over $comm is not bitwise one rank:"; diff "$tmp/want" "$tmp/got"; exit 1; }
}
# canonical 1f1b, saved at step k; resumed there (the last steps, canonical: one rank's again)
"$loom" launch -n 2 "$recipe" "${args[@]}" comm="$comm" "${pp[@]}" schedule=1f1b \
  deterministic=canonical checkpoint.dir="$tmp/ppck" checkpoint.every=$k > "$tmp/pp_1f1b" \
  2> "$tmp/pp.err" || { cat "$tmp/pp.err"; exit 1; }
pp_same "canonical pp=2 1f1b" "$tmp/pp_1f1b"
ck=$(ls -d "$tmp"/ppck/step_*"$k" 2>/dev/null | head -1)
[[ -n $ck ]] || { echo "pp=2: no checkpoint of step $k in $tmp/ppck: $(ls "$tmp/ppck" 2>&1)"; exit 1; }
"$loom" launch -n 2 "$recipe" "${args[@]}" comm="$comm" "${pp[@]}" schedule=1f1b \
  deterministic=canonical resume="$ck" > "$tmp/pp_res" 2> "$tmp/pp_res.err" || { cat "$tmp/pp_res.err"; exit 1; }
resumed_bitwise "canonical pp=2 1f1b" "$tmp/pp_res" "$tmp/pp_want"
# zb1 and the fast run with each run of transfers posted as one group (LOOM_PP_GROUPED=1:
# what nccl, whose sends wait for their receivers, always gets; here on the host comm)
LOOM_PP_GROUPED=1 "$loom" launch -n 2 "$recipe" "${args[@]}" comm="$comm" "${pp[@]}" schedule=zb1 \
  deterministic=canonical steps=$((k + 1)) > "$tmp/pp_zb1" 2> "$tmp/pp.err" || { cat "$tmp/pp.err"; exit 1; }
pp_same "canonical pp=2 zb1" "$tmp/pp_zb1" $((k + 1))
echo "backend=$backend comm=$comm: canonical pp=2 bitwise one rank (losses and norms): 1f1b over" \
  "$steps steps, saved at step $k and resumed; zb1, transfers grouped, over $((k + 1))"
# fast mode, k+1 steps, against one rank's
"$loom" run "$recipe" "${args[@]}" model.layers=2 steps=$((k + 1)) > "$tmp/pp_one_fast" \
  2> "$tmp/pp_one.err" || { cat "$tmp/pp_one.err"; exit 1; }
LOOM_PP_GROUPED=1 "$loom" launch -n 2 "$recipe" "${args[@]}" comm="$comm" "${pp[@]}" schedule=1f1b steps=$((k + 1)) \
  > "$tmp/pp" 2> "$tmp/pp.err" || { cat "$tmp/pp.err"; exit 1; }
runs_close "backend=$backend comm=$comm: fast pp=2 vs one rank" "$tmp/pp_one_fast" "$tmp/pp" \
  $((k + 1)) "$tol" || exit 1
fell=$(loss_fell "$tmp/pp" 0.05) || { echo "fast pp=2: the loss did not fall: $fell"; exit 1; }
echo "backend=$backend comm=$comm: fast pp=2 (transfers grouped) loss $fell"
# ZeRO with 16-bit weights in device memory (zero_master.c on zero_device.c's buffers):
# stages 1 and 2 keep the fp32 master's partition in the backend's memory (a host mirror
# for checkpoints), round each rank's sub-blocks into the bf16 compute copy with the
# backend's convert_from_f32 and all-gather that copy (at dim 48 its last bucket through
# the tail staging); stage 3 gathers fp32 units and the model rounds each one.
#  - canonical zero=1 (saving at step k: the master's partition as model.dp<d> slices) and
#    zero=3 (sparse parameter buffer) bitwise one rank's bf16 run; resumed at k, bitwise;
#  - fast zero=2 (small buckets) within TOL of one rank's fast bf16 run.
b16=("${zargs[@]}" precision=bf16)
"$loom" run "$recipe" "${b16[@]}" deterministic=canonical > "$tmp/b16_one" 2> "$tmp/b16.err" ||
  { cat "$tmp/b16.err"; exit 1; }
grep '^LOSS\|^NORM' "$tmp/b16_one" > "$tmp/want"
for z in 1 3; do
  ck=(); [[ $z == 1 ]] && ck=(checkpoint.dir="$tmp/ck_b16" checkpoint.every=$k)
  "$loom" launch -n 2 "$recipe" "${b16[@]}" comm="$comm" mesh.dp=2 strategy.zero=$z \
    deterministic=canonical "${ck[@]}" > "$tmp/b16_z$z" 2> "$tmp/b16.err" || { cat "$tmp/b16.err"; exit 1; }
  grep '^LOSS\|^NORM' "$tmp/b16_z$z" > "$tmp/got" || true
  [[ $(grep -c '^LOSS' "$tmp/want") -eq $steps ]] && cmp -s "$tmp/want" "$tmp/got" ||
    { echo "canonical bf16 zero=$z dp=2 on $backend over $comm is not bitwise one rank:"; diff "$tmp/want" "$tmp/got"; exit 1; }
done
"$loom" launch -n 2 "$recipe" "${b16[@]}" comm="$comm" mesh.dp=2 strategy.zero=1 deterministic=canonical \
  checkpoint.dir="$tmp/ck_b16" resume="$tmp/ck_b16/$(printf step_%08d $k)" > "$tmp/b16_res" 2> "$tmp/b16.err" ||
  { cat "$tmp/b16.err"; exit 1; }
resumed_bitwise "canonical bf16 zero=1 dp=2" "$tmp/b16_res" "$tmp/b16_one"
echo "backend=$backend comm=$comm: canonical bf16 zero=1 and zero=3 dp=2 dim 48 bitwise one rank over" \
  "$steps steps; zero=1 saved at step $k (the master's partitions) and resumed, bitwise"
# zero=1's fp32 buffer beside the master's partition (zero_master.c on zero_sparse.c): with
# the backend's vm ops a sparse range, nothing committed when no reader keeps a span
# (MEM's master: the partition alone, half the state's bytes; params_peak_resident 0); the
# whole of it held for an llm.c load (the run starts from a file) and for llm.c save and
# export_safetensors (zero_export.lua): losses, norms and every rank's files byte for byte
# the same run on whole allocations (LOOM_ZERO_SPARSE=0)
read -r _ _ _ _ zo _ _ zpk _ zm _ <<< "$(grep '^MEM 1 ' "$tmp/b16_z1")"
[[ $zm -gt 0 && $zm -eq $((zo / 2)) && $zpk -eq 0 ]] ||
  { echo "bf16 zero=1 dp=2: master $zm bytes (want the partition, $((zo / 2))), committed peak $zpk (want 0)"; exit 1; }
"$loom" run "$here/recipes/losses.lua" threads=1 steps=1 checkpoint.dir="$tmp/m16ck" > /dev/null &&
  "$loom" export --llmc "$tmp/m16ck" "$tmp/m16.bin" > /dev/null || { echo "no llm.c file to start from"; exit 1; }
for sp in 1 0; do
  EXPORT_OUT="$tmp/m16x$sp" LOOM_ZERO_SPARSE=$sp "$loom" launch -n 2 "$here/recipes/zero_export.lua" threads=1 \
    backend="$backend" comm="$comm" mesh.dp=2 precision=bf16 strategy.zero=1 steps=3 model.init="$tmp/m16.bin" \
    > "$tmp/m16_$sp" 2> "$tmp/m16.err" || { cat "$tmp/m16.err"; exit 1; }
done
[[ $(grep -c '^LOSS' "$tmp/m16_1") -eq 3 ]] && cmp -s <(grep '^LOSS\|^NORM' "$tmp/m16_1") <(grep '^LOSS\|^NORM' "$tmp/m16_0") ||
  { echo "bf16 zero=1 on the sparse fp32 buffer: losses differ from whole allocations'"; diff "$tmp/m16_1" "$tmp/m16_0"; exit 1; }
for r in 0 1; do
  for f in bin st; do
    [[ -s "$tmp/m16x0.rank$r.$f" ]] && cmp -s "$tmp/m16x0.rank$r.$f" "$tmp/m16x1.rank$r.$f" ||
      { echo "bf16 zero=1: rank $r's .$f from the sparse fp32 buffer differs from whole allocations'"; exit 1; }
  done
done
echo "backend=$backend comm=$comm: bf16 zero=1's fp32 buffer sparse: master $zm bytes a rank (the" \
  "partition), nothing committed; from an llm.c file, its llm.c save and export byte for byte whole allocations'"
# fast against fast (canonical's one-rank run parts from it by 1e-5 at step 3: a bf16 weight
# crosses a rounding boundary once the fp32 sums differ)
"$loom" run "$recipe" "${b16[@]}" > "$tmp/b16_fast" 2> "$tmp/b16.err" || { cat "$tmp/b16.err"; exit 1; }
"$loom" launch -n 2 "$recipe" "${b16[@]}" comm="$comm" mesh.dp=2 strategy.zero=2 strategy.dp.bucket_mb=0.01 \
  > "$tmp/b16_z2" 2> "$tmp/b16.err" || { cat "$tmp/b16.err"; exit 1; }
runs_close "backend=$backend comm=$comm: fast bf16 zero=2 dp=2 dim 48 vs one rank" \
  "$tmp/b16_fast" "$tmp/b16_z2" "$steps" "$tol" || exit 1
# The optimizer offloaded beside ZeRO in device memory (offload_device.c over ZeRO's
# segments: the partition's parameters and gradients copied to the host chunk by chunk, the
# host step, the parameters copied back; the state partition in the host pool alone):
#  - bf16 zero=2 under offload = host bitwise the same run without (above);
#  - zero=3 resumed under offload from the step-k checkpoint saved without it (the state
#    partition into the pool): the last steps bitwise the straight run's; nothing of the
#    state on the device (optimizer 0), the partition's 2 x 4 x P/2 bytes offloaded.
off=(strategy.offload.optimizer=host strategy.offload.chunk_mb=0.01)
"$loom" launch -n 2 "$recipe" "${b16[@]}" comm="$comm" mesh.dp=2 strategy.zero=2 strategy.dp.bucket_mb=0.01 \
  "${off[@]}" > "$tmp/b16_z2o" 2> "$tmp/b16.err" || { cat "$tmp/b16.err"; exit 1; }
grep '^LOSS\|^NORM' "$tmp/b16_z2" > "$tmp/want"
grep '^LOSS\|^NORM' "$tmp/b16_z2o" > "$tmp/got" || true
[[ $(grep -c '^LOSS' "$tmp/want") -eq $steps ]] && cmp -s "$tmp/want" "$tmp/got" ||
  { echo "bf16 zero=2 dp=2 under offload on $backend is not bitwise the run without:"; diff "$tmp/want" "$tmp/got"; exit 1; }
"$loom" launch -n 2 "$recipe" "${zargs[@]}" comm="$comm" mesh.dp=2 strategy.zero=3 strategy.dp.bucket_mb=0.01 \
  "${off[@]}" resume="$tmp/zk/step_$(printf %08d $k)" > "$tmp/zores" 2> "$tmp/zores.err" || { cat "$tmp/zores.err"; exit 1; }
resumed_bitwise "zero=3 dp=2 under offload" "$tmp/zores" "$tmp/z3"
read -r _ _ _ _ st _ <<< "$(grep '^MEM 1 ' "$tmp/z3")"
read -r _ _ _ _ o_dev _ _ _ o_off _ <<< "$(grep "^MEM $steps " "$tmp/zores")"
[[ $st -gt 0 && $o_dev -eq 0 && $o_off -eq $st ]] ||
  { echo "zero=3 under offload: optimizer $o_dev bytes on the device and $o_off offloaded, the partition $st"; exit 1; }
echo "backend=$backend comm=$comm: offload beside zero: bf16 zero=2 bitwise without offload; zero=3" \
  "resumed under offload from a save without it, bitwise; the state's $o_off bytes off the device"
# reduce = "bf16" in device memory (dp.c: the buckets rounded into a staging buffer of the
# backend's with its convert_from_f32, all-reduced as bf16 over the device dp group, widened
# back with convert_to_f32): against the CPU backend's dp=2 with the same reduce. The
# rounding of the gradients shows at step 1 (reduce = "f32" is 7e-4 off in the norm there,
# the CPU's reduce = "bf16" 4e-8): step 1 within TOL, every step within max(TOL, 2e-3) (from
# step 2 a gradient element near a bf16 rounding boundary rounds the other way once the fp32
# sums differ, one bf16 ulp: 5.8e-5 in step 2's norm, 3.5e-4 at step 3; cuda_train.sh's
# bf16_close allows the same).
rb=("${zargs[@]}" 'precision={"bf16", reduce="bf16"}' mesh.dp=2)
"$loom" launch -n 2 "$recipe" "${rb[@]}" comm="$comm" > "$tmp/rb" 2> "$tmp/rb.err" || { cat "$tmp/rb.err"; exit 1; }
"$loom" launch -n 2 "$recipe" "${rb[@]}" backend=cpu comm=shm threads=1 > "$tmp/rb_cpu" 2> "$tmp/rb.err" ||
  { cat "$tmp/rb.err"; exit 1; }
late=$(awk -v t="$tol" 'BEGIN { print (t + 0 > 2e-3) ? t : 2e-3 }')
grep -E '^(LOSS|NORM) 1 ' "$tmp/rb_cpu" > "$tmp/want"; grep -E '^(LOSS|NORM) 1 ' "$tmp/rb" > "$tmp/got"
runs_close "backend=$backend comm=$comm: bf16 reduce=bf16 dp=2 vs the CPU's (step 1)" "$tmp/want" "$tmp/got" 1 "$tol" &&
  runs_close "backend=$backend comm=$comm: bf16 reduce=bf16 dp=2 vs the CPU's (every step)" "$tmp/rb_cpu" "$tmp/rb" \
    "$steps" "$late" || exit 1
# offload.params = true in device memory (zero_params_store.c: the partition in the offload,
# each unit's part read into host staging, copied host -> device into this rank's own block
# of the receive buffer and all-gathered there over the device dp group; offload_device.c
# copies only the gradients over and steps the pool's or the file's parameters):
#  - zero=3 dp=2, the partition in the host pool, bitwise z3 (the same run without offload;
#    the optimizer's offload alone is bitwise it, above), no parameter partition on the
#    device (params 0) and the start-up line naming the offloaded params;
#  - saved at step k from the pool, resumed with the partition in a file (disk): bitwise;
#  - the CPU backend's same run (the partition in its host pool) within TOL.
zpo=("${zargs[@]}" mesh.dp=2 strategy.zero=3 strategy.dp.bucket_mb=0.01 strategy.offload.chunk_mb=0.01
     strategy.offload.params=true)
"$loom" launch -n 2 "$recipe" "${zpo[@]}" comm="$comm" strategy.offload.optimizer=host \
  checkpoint.dir="$tmp/zpk" checkpoint.every=$k > "$tmp/zp" 2> "$tmp/zp.err" || { cat "$tmp/zp.err"; exit 1; }
grep '^LOSS\|^NORM' "$tmp/z3" > "$tmp/want"
grep '^LOSS\|^NORM' "$tmp/zp" > "$tmp/got" || true
[[ $(grep -c '^LOSS' "$tmp/want") -eq $steps ]] && cmp -s "$tmp/want" "$tmp/got" ||
  { echo "zero=3 dp=2 offload.params on $backend is not bitwise the run without offload:"; diff "$tmp/want" "$tmp/got"; exit 1; }
read -r _ _ p_dev _ <<< "$(grep "^MEM $steps " "$tmp/zp")"
[[ $p_dev -eq 0 ]] && grep -q '| params offloaded ' "$tmp/zp" ||
  { echo "zero=3 offload.params on $backend: params $p_dev bytes on the device"; head -2 "$tmp/zp"; exit 1; }
mkdir "$tmp/zpd"
"$loom" launch -n 2 "$recipe" "${zpo[@]}" comm="$comm" strategy.offload.optimizer=disk strategy.offload.path="$tmp/zpd" \
  resume="$tmp/zpk/step_$(printf %08d $k)" > "$tmp/zpres" 2> "$tmp/zpres.err" || { cat "$tmp/zpres.err"; exit 1; }
resumed_bitwise "zero=3 dp=2 offload.params (saved from the pool, resumed on disk)" "$tmp/zpres" "$tmp/z3"
[[ -z $(ls -A "$tmp/zpd") ]] || { echo "offload.params on disk: the files are left: $(ls "$tmp/zpd")"; exit 1; }
"$loom" launch -n 2 "$recipe" "${zpo[@]}" strategy.offload.optimizer=host backend=cpu comm=shm threads=1 \
  > "$tmp/zp_cpu" 2> "$tmp/zp.err" || { cat "$tmp/zp.err"; exit 1; }
runs_close "backend=$backend comm=$comm: zero=3 dp=2 offload.params vs backend=cpu's" "$tmp/zp_cpu" "$tmp/zp" \
  "$steps" "$tol" || exit 1
echo "backend=$backend comm=$comm: zero=3 dp=2 offload.params bitwise without offload, params 0 bytes on the" \
  "device; saved at step $k (host) and resumed (disk), bitwise; within $tol of the CPU's"

# Expert parallelism in device memory (session_ep.c, moe.c): a 4-expert top-2 MoE block,
# dp=2 ep=2 (each rank 2 of the experts), against one rank on the same backend. The token
# rows go by all-to-all-v over the device dp group split for ep (dist_staged.c's split: a
# staged child of the host split), the counts and the norm's slots over the host ep group.
#  - canonical: losses and norms bitwise one rank's (each expert one GEMM per source rank,
#    the per-source sums in the fixed tree: docs/MOE.md); saved at step k by both ranks (the
#    whole model gathered over the host ep group from the host mirrors) and resumed: bitwise;
#  - fast: within TOL of one rank's fast run;
#  - each rank holds its experts alone (MEM's params below one rank's);
#  - ZeRO beside ep: see the next section.
moe=("${args[@]}" model.moe.experts=4 model.moe.top_k=2)
k=$((steps - 2))
"$loom" run "$recipe" "${moe[@]}" deterministic=canonical > "$tmp/ep_one" 2> "$tmp/ep.err" ||
  { cat "$tmp/ep.err"; exit 1; }
"$loom" launch -n 2 "$recipe" "${moe[@]}" comm="$comm" mesh.dp=2 mesh.ep=2 deterministic=canonical \
  checkpoint.dir="$tmp/ck_ep" checkpoint.every=$k > "$tmp/ep_c" 2> "$tmp/ep.err" || { cat "$tmp/ep.err"; exit 1; }
grep '^LOSS\|^NORM' "$tmp/ep_one" > "$tmp/want"
grep '^LOSS\|^NORM' "$tmp/ep_c" > "$tmp/got" || true
[[ $(grep -c '^LOSS' "$tmp/want") -eq $steps ]] && cmp -s "$tmp/want" "$tmp/got" ||
  { echo "canonical dp=2 ep=2 on $backend over $comm is not bitwise one rank:"; diff "$tmp/want" "$tmp/got"; exit 1; }
read -r _ _ p_one _ <<< "$(grep '^MEM 1 ' "$tmp/ep_one")"
read -r _ _ p_ep _ <<< "$(grep '^MEM 1 ' "$tmp/ep_c")"
[[ $p_ep -gt 0 && $p_ep -lt $p_one ]] ||
  { echo "dp=2 ep=2: $p_ep parameter bytes a rank, one rank $p_one: the experts are not split"; exit 1; }
"$loom" launch -n 2 "$recipe" "${moe[@]}" comm="$comm" mesh.dp=2 mesh.ep=2 deterministic=canonical \
  checkpoint.dir="$tmp/ck_ep" resume="$tmp/ck_ep/$(printf step_%08d $k)" > "$tmp/ep_res" 2> "$tmp/ep.err" ||
  { cat "$tmp/ep.err"; exit 1; }
resumed_bitwise "canonical dp=2 ep=2" "$tmp/ep_res" "$tmp/ep_one"
echo "backend=$backend comm=$comm: canonical dp=2 ep=2 (moe, 4 experts) bitwise one rank over $steps" \
  "steps, $p_ep parameter bytes a rank (one rank $p_one); saved at step $k and resumed, bitwise"
"$loom" run "$recipe" "${moe[@]}" > "$tmp/ep_one_fast" 2> "$tmp/ep.err" || { cat "$tmp/ep.err"; exit 1; }
"$loom" launch -n 2 "$recipe" "${moe[@]}" comm="$comm" mesh.dp=2 mesh.ep=2 > "$tmp/ep" 2> "$tmp/ep.err" ||
  { cat "$tmp/ep.err"; exit 1; }
runs_close "backend=$backend comm=$comm: fast dp=2 ep=2 vs one rank" "$tmp/ep_one_fast" "$tmp/ep" \
  "$steps" "$tol" || exit 1

# ZeRO beside expert parallelism in device memory (zero_ep.c, zero_ep_reduce.c,
# zero_ep_params.c, zero_ep_gather.c): the two packed partitions (the dense entries over dp,
# this rank's experts over its edp group, which is one rank at dp=2 ep=2), the state, the
# staging, stage 2's gradient and stage 3's parameter partitions the backend's memory, the
# buckets packed and unpacked by the backend's ops and exchanged over the device groups,
# the whole state for a checkpoint summed over the host groups from the host mirrors.
#  - canonical zero=3 (stage 1's fixed tree, the per-unit gathers) bitwise one rank's losses
#    and norms; saved at step k (the whole state from the host mirror, the units pinned and
#    mirrored again) and resumed on two ranks: bitwise;
#  - fast zero=1 bitwise fast ep (losses and norms: the same reductions, an element-wise
#    update); fast zero=2 losses bitwise fast ep's (as the CPU's moe.sh holds), and within
#    TOL of one rank on this backend and of one rank on the CPU backend (fast zero=3, by
#    hand: ep's losses too; its gradients are zero=2's, its gathers canonical zero=3's);
#  - the bytes: zero=3 holds 4 (D/dp + X/edp) of parameters, zero=2 as many of gradients,
#    both twice that of optimizer state, D and X (this rank's expert floats) from ep's and
#    one rank's MEM.
"$loom" run "$recipe" "${moe[@]}" backend=cpu > "$tmp/ep_one_cpu" 2> "$tmp/ez.err" || { cat "$tmp/ez.err"; exit 1; }
Xb=$((p_one - p_ep)) Db=$((p_ep - (p_one - p_ep)))
part=$((Db / 2 + Xb))
for z in 3; do
  "$loom" launch -n 2 "$recipe" "${moe[@]}" comm="$comm" mesh.dp=2 mesh.ep=2 strategy.zero=$z \
    deterministic=canonical checkpoint.dir="$tmp/ck_ez$z" checkpoint.every=$k > "$tmp/ez${z}_c" 2> "$tmp/ez.err" ||
    { cat "$tmp/ez.err"; exit 1; }
  grep '^LOSS\|^NORM' "$tmp/ep_one" > "$tmp/want"
  grep '^LOSS\|^NORM' "$tmp/ez${z}_c" > "$tmp/got" || true
  cmp -s "$tmp/want" "$tmp/got" ||
    { echo "canonical dp=2 ep=2 zero=$z on $backend over $comm is not bitwise one rank:"; diff "$tmp/want" "$tmp/got"; exit 1; }
  "$loom" launch -n 2 "$recipe" "${moe[@]}" comm="$comm" mesh.dp=2 mesh.ep=2 strategy.zero=$z \
    deterministic=canonical checkpoint.dir="$tmp/ck_ez$z" resume="$tmp/ck_ez$z/$(printf step_%08d $k)" \
    > "$tmp/ez${z}_res" 2> "$tmp/ez.err" || { cat "$tmp/ez.err"; exit 1; }
  resumed_bitwise "canonical dp=2 ep=2 zero=$z" "$tmp/ez${z}_res" "$tmp/ep_one"
done
echo "backend=$backend comm=$comm: canonical dp=2 ep=2 zero=3 bitwise one rank over $steps" \
  "steps; saved at step $k and resumed, bitwise"
for z in 1 2; do
  "$loom" launch -n 2 "$recipe" "${moe[@]}" comm="$comm" mesh.dp=2 mesh.ep=2 strategy.zero=$z \
    > "$tmp/ez$z" 2> "$tmp/ez.err" || { cat "$tmp/ez.err"; exit 1; }
done
cmp -s <(grep '^LOSS\|^NORM' "$tmp/ep") <(grep '^LOSS\|^NORM' "$tmp/ez1") ||
  { echo "fast dp=2 ep=2 zero=1 on $backend is not bitwise dp=2 ep=2:"; diff "$tmp/ep" "$tmp/ez1"; exit 1; }
for z in 2; do
  cmp -s <(grep '^LOSS' "$tmp/ep") <(grep '^LOSS' "$tmp/ez$z") ||
    { echo "fast dp=2 ep=2 zero=$z on $backend: losses not bitwise dp=2 ep=2's:"; diff "$tmp/ep" "$tmp/ez$z"; exit 1; }
  runs_close "backend=$backend comm=$comm: fast dp=2 ep=2 zero=$z vs one rank" "$tmp/ep_one_fast" "$tmp/ez$z" \
    "$steps" "$tol" || exit 1
  runs_close "backend=$backend comm=$comm: fast dp=2 ep=2 zero=$z vs the CPU's one rank" "$tmp/ep_one_cpu" \
    "$tmp/ez$z" "$steps" "$tol" || exit 1
done
read -r _ _ zp _ zo _ <<< "$(grep '^MEM 1 ' "$tmp/ez3_c")"
read -r _ _ _ zg _ <<< "$(grep '^MEM 1 ' "$tmp/ez2")"
[[ $zp -eq $part && $zg -eq $part && $zo -eq $((2 * part)) ]] ||
  { echo "dp=2 ep=2: zero=3's params $zp, zero=2's grads $zg, optimizer $zo bytes; want $part, $part," \
         "$((2 * part)) (D = $((Db / 4)), X = $((Xb / 4)) floats)"; exit 1; }
echo "backend=$backend comm=$comm: fast dp=2 ep=2 zero=1 bitwise dp=2 ep=2; zero=2 its losses bitwise," \
  "within $tol of one rank; zero=3's params and zero=2's grads $part bytes a rank, optimizer $((2 * part))"

# ZeRO with 16-bit weights beside ep (zero_ep.c, as on the CPU: every rank keeps the whole
# fp32 master in the model's buffer, gathered after each step, and the backend rounds the
# compute copy from it): canonical bf16 dp=2 ep=2 zero=1, and zero=3 (saved at step k and
# resumed), bitwise one rank's canonical bf16 (losses and norms)
"$loom" run "$recipe" "${moe[@]}" precision=bf16 deterministic=canonical > "$tmp/eb_one" 2> "$tmp/eb.err" ||
  { cat "$tmp/eb.err"; exit 1; }
for z in 1 3; do
  ck=(); [[ $z == 3 ]] && ck=(checkpoint.dir="$tmp/ck_eb" checkpoint.every=$k)
  "$loom" launch -n 2 "$recipe" "${moe[@]}" comm="$comm" mesh.dp=2 mesh.ep=2 strategy.zero=$z \
    precision=bf16 deterministic=canonical "${ck[@]}" > "$tmp/eb$z" 2> "$tmp/eb.err" || { cat "$tmp/eb.err"; exit 1; }
  bits_same "canonical bf16 dp=2 ep=2 zero=$z vs one rank's" "$tmp/eb_one" "$tmp/eb$z"
done
"$loom" launch -n 2 "$recipe" "${moe[@]}" comm="$comm" mesh.dp=2 mesh.ep=2 strategy.zero=3 precision=bf16 \
  deterministic=canonical resume="$tmp/ck_eb/$(printf step_%08d $k)" > "$tmp/eb_res" 2> "$tmp/eb.err" ||
  { cat "$tmp/eb.err"; exit 1; }
resumed_bitwise "canonical bf16 dp=2 ep=2 zero=3" "$tmp/eb_res" "$tmp/eb_one"
echo "backend=$backend comm=$comm: canonical bf16 dp=2 ep=2 zero=3 saved at step $k and resumed, bitwise"

# Expert parallelism beside pipeline and tensor parallelism in device memory (four ranks,
# dp=2 ep=2 each, a global batch of 4, micro 1), against one rank with the same batch:
#  - pp=2 (one block a stage, 2 micro-batches a rank): canonical 1f1b bitwise one rank
#    (losses and norms: each stage's expert trees, loom_ep_end_chunk, on the backend's
#    allocations), saved at step k and resumed, bitwise; fast 1f1b within TOL;
#  - tp=2 with sequence parallelism: canonical bitwise one rank; fast within TOL.
if [[ $comm == nccl && $(gpus) -lt 4 ]]; then # the last lines of the script
  echo "backend=$backend comm=nccl: ep beside pp=2 and tp=2 not run: they need 4 GPUs (one a rank);" \
    "$(gpus) visible"
  exit 0
fi
moe4=("${moe[@]}" batch.global=4 comm="$comm" mesh.dp=2 mesh.ep=2)
"$loom" run "$recipe" "${moe[@]}" batch.global=4 deterministic=canonical > "$tmp/e4_one" 2> "$tmp/ez.err" ||
  { cat "$tmp/ez.err"; exit 1; }
"$loom" run "$recipe" "${moe[@]}" batch.global=4 > "$tmp/e4_one_f" 2> "$tmp/ez.err" || { cat "$tmp/ez.err"; exit 1; }
"$loom" run "$recipe" "${moe[@]}" batch.global=4 model.layers=2 deterministic=canonical > "$tmp/e4pp_one" \
  2> "$tmp/ez.err" || { cat "$tmp/ez.err"; exit 1; }
"$loom" run "$recipe" "${moe[@]}" batch.global=4 model.layers=2 > "$tmp/e4pp_one_f" 2> "$tmp/ez.err" ||
  { cat "$tmp/ez.err"; exit 1; }
ep_pp=("${moe4[@]}" model.layers=2 mesh.pp=2 microbatches=2 schedule=1f1b)
"$loom" launch -n 4 "$recipe" "${ep_pp[@]}" deterministic=canonical checkpoint.dir="$tmp/ck_epp" \
  checkpoint.every=$k > "$tmp/epp_c" 2> "$tmp/ez.err" || { cat "$tmp/ez.err"; exit 1; }
cmp -s <(grep '^LOSS\|^NORM' "$tmp/e4pp_one") <(grep '^LOSS\|^NORM' "$tmp/epp_c") ||
  { echo "canonical pp=2 dp=2 ep=2 on $backend is not bitwise one rank:"; diff "$tmp/e4pp_one" "$tmp/epp_c"; exit 1; }
"$loom" launch -n 4 "$recipe" "${ep_pp[@]}" deterministic=canonical checkpoint.dir="$tmp/ck_epp" \
  resume="$tmp/ck_epp/$(printf step_%08d $k)" > "$tmp/epp_res" 2> "$tmp/ez.err" || { cat "$tmp/ez.err"; exit 1; }
resumed_bitwise "canonical pp=2 dp=2 ep=2" "$tmp/epp_res" "$tmp/e4pp_one"
"$loom" launch -n 4 "$recipe" "${ep_pp[@]}" > "$tmp/epp" 2> "$tmp/ez.err" || { cat "$tmp/ez.err"; exit 1; }
runs_close "backend=$backend comm=$comm: fast pp=2 dp=2 ep=2 vs one rank" "$tmp/e4pp_one_f" "$tmp/epp" \
  "$steps" "$tol" || exit 1
echo "backend=$backend comm=$comm: canonical pp=2 dp=2 ep=2 bitwise one rank over $steps steps;" \
  "saved at step $k and resumed, bitwise"
ep_tp=("${moe4[@]}" mesh.tp=2 tp_sequence_parallel=true)
"$loom" launch -n 4 "$recipe" "${ep_tp[@]}" deterministic=canonical > "$tmp/etp_c" 2> "$tmp/ez.err" ||
  { cat "$tmp/ez.err"; exit 1; }
cmp -s <(grep '^LOSS\|^NORM' "$tmp/e4_one") <(grep '^LOSS\|^NORM' "$tmp/etp_c") ||
  { echo "canonical tp=2 sp dp=2 ep=2 on $backend is not bitwise one rank:"; diff "$tmp/e4_one" "$tmp/etp_c"; exit 1; }
"$loom" launch -n 4 "$recipe" "${ep_tp[@]}" > "$tmp/etp" 2> "$tmp/ez.err" || { cat "$tmp/ez.err"; exit 1; }
runs_close "backend=$backend comm=$comm: fast tp=2 sp dp=2 ep=2 vs one rank" "$tmp/e4_one_f" "$tmp/etp" \
  "$steps" "$tol" || exit 1
echo "backend=$backend comm=$comm: canonical tp=2 sp dp=2 ep=2 bitwise one rank over $steps steps"
