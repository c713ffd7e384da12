#!/usr/bin/env bash
# zero.sh LOOM — ZeRO stages 1, 2 and 3 (strategy = { zero = N }, docs/ZERO.md) on one
# node through `loom launch` and the shm communicator, on the small test model:
#  - fast mode, dp=2, 3 (a size that does not divide) and 4, 20 steps: zero=1 trains bitwise the losses of plain dp (the
#    same all-reduce, an element-wise optimizer); zero=2 (reduce-scatter in buckets during
#    backward) and zero=3 (parameters gathered per layer too) within 1e-4 of plain dp
#    (fp32, only summation order may differ), with accumulation too, and with dp=2 x tp=2;
#    zero=3's evaluation and sampling give plain dp's text;
#  - each stage run twice: bitwise identical;
#  - canonical mode: losses and grad norms bitwise identical across zero = 0, 1, 2, 3 and
#    dp = 1, 2, 4, and dp=2 x tp=2;
#  - per-rank bytes by category against the ZeRO paper's formulas (fp32 AdamW, K = 8:
#    dp 16Ψ, zero=1 8Ψ + 8Ψ/N, zero=2 4Ψ + 12Ψ/N, zero=3 16Ψ/N) within 10% at dp=2 and
#    dp=4, and bf16's (zero=1 6Ψ + 12Ψ/N, zero=2 2Ψ + 16Ψ/N, zero=3 2Ψ + 16Ψ/N: the fp32
#    master partitioned at every stage, 4P/N bytes exactly, P the padded buffer) at dp=2
#    and, zero=3, dp=4; the full-size buffers the model computes in (stage 2's gradients, stage 3's
#    parameters) are resident for at most half their size on a deeper model;
#  - bf16 (the fp32 master partitioned, zero_master.c): zero=1 dp=2 (started from an llm.c
#    file) and zero=2 dp=3 train
#    bitwise the losses and norms of the same layout with the master whole on every rank
#    (LOOM_ZERO_MASTER=whole), and so does dp=2 x tp=2 zero=2; canonical zero=2 at dp=2
#    and at dp=2 x tp=2 gives one rank's bits; llm.c save and export_safetensors (the
#    master gathered for the write) write each rank's files byte for byte the whole
#    master's (zero=1 dp=2, zero=2 dp=3);
#  - zero=3's partitioned construction: bitwise the losses of the whole model's
#    (LOOM_ZERO_INIT=whole), and the start-up peak of the resident set of every rank below
#    the whole model's by at least 90% of the (N-1)/N of the parameters it does not own
#    (2.7 M parameters, dp=2 and 4);
#  - what is not built is refused with a message: zero=3 with llm.c weights (zero with
#    pp: zero_pp.sh; offload: offload.sh; checkpoints under zero: zero_ckpt.sh).
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
recipe=$here/recipes/losses.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive   # several ranks share 2 cores: OpenMP must not spin
lines() { grep -E '^(LOSS|NORM) '; }
run1() { "$loom" run "$recipe" threads=1 "$@" | lines; }
runN() { local n=$1; shift; "$loom" launch -n "$n" "$recipe" threads=1 mesh.dp="$n" comm_timeout=10 "$@" | lines; }
small="strategy.dp.bucket_mb=0.01"   # ~14 buckets on the 139 KB model: the overlapped path

# --- fast mode against plain dp -------------------------------------------------------
for n in 2 4; do
  b=$((8 / n))
  runN $n batch.micro=$b > "$tmp/dp$n"
  runN $n batch.micro=$b strategy.zero=1 > "$tmp/z1_$n"
  finite_losses "$tmp/dp$n" "$tmp/z1_$n"
  cmp -s "$tmp/dp$n" "$tmp/z1_$n" || { echo "zero=1 dp=$n differs from plain dp"; paste "$tmp/dp$n" "$tmp/z1_$n" | head; exit 1; }
  echo "ok fast zero=1 dp=$n: losses and norms bitwise those of plain dp over $(grep -c LOSS "$tmp/dp$n") steps"
  for bucket in "" "$small"; do
    runN $n batch.micro=$b strategy.zero=2 $bucket > "$tmp/z2_$n"
    d=$(max_loss_diff "$tmp/dp$n" "$tmp/z2_$n")
    below "$d" 1e-4 || { echo "zero=2 dp=$n ${bucket:-one bucket} differs from plain dp by $d"; exit 1; }
    echo "ok fast zero=2 dp=$n ${bucket:-(one bucket)}: max |loss diff| vs plain dp $d over 20 steps"
  done
  runN $n batch.micro=$b strategy.zero=3 > "$tmp/z3_$n"
  d=$(max_loss_diff "$tmp/dp$n" "$tmp/z3_$n")
  below "$d" 1e-4 || { echo "zero=3 dp=$n differs from plain dp by $d"; exit 1; }
  echo "ok fast zero=3 dp=$n: max |loss diff| vs plain dp $d over 20 steps"
done
# dp=3: 34688 floats are not a multiple of 16 x 3, so the tail bucket and padding run
runN 3 batch.micro=2 > "$tmp/dp3"
runN 3 batch.micro=2 strategy.zero=1 $small > "$tmp/z1_3"
cmp -s "$tmp/dp3" "$tmp/z1_3" || { echo "zero=1 dp=3 differs from plain dp"; exit 1; }
runN 3 batch.micro=2 strategy.zero=2 $small > "$tmp/z2_3"
d=$(max_loss_diff "$tmp/dp3" "$tmp/z2_3")
below "$d" 1e-4 || { echo "zero=2 dp=3 differs from plain dp by $d"; exit 1; }
runN 3 batch.micro=2 strategy.zero=3 > "$tmp/z3_3"
d3=$(max_loss_diff "$tmp/dp3" "$tmp/z3_3")
below "$d3" 1e-4 || { echo "zero=3 dp=3 differs from plain dp by $d3"; exit 1; }
echo "ok fast dp=3 (partitions padded past the buffer's end): zero=1 bitwise plain dp, max |loss diff| zero=2 $d, zero=3 $d3"
# accumulation: zero=2 reduces every micro-batch into the partition, dp sums them first
runN 2 batch.micro=2 batch.global=8 > "$tmp/acc_dp"
for z in 2 3; do
  runN 2 batch.micro=2 batch.global=8 strategy.zero=$z $small > "$tmp/acc_z$z"
  d=$(max_loss_diff "$tmp/acc_dp" "$tmp/acc_z$z")
  below "$d" 1e-4 || { echo "zero=$z with 2 micro-batches per rank differs from plain dp by $d"; exit 1; }
  echo "ok fast zero=$z dp=2 with 2 micro-batches per rank: max |loss diff| vs plain dp $d"
done
# with tensor parallelism: dp=2 x tp=2 on 4 ranks
runT() { "$loom" launch -n 4 "$recipe" threads=1 mesh.dp=2 mesh.tp=2 comm_timeout=10 "$@" | lines; }
runT batch.micro=4 > "$tmp/tp_dp"
for z in 1 2 3; do
  runT batch.micro=4 strategy.zero=$z $small > "$tmp/tp_z$z"
  d=$(max_loss_diff "$tmp/tp_dp" "$tmp/tp_z$z")
  below "$d" 1e-4 || { echo "zero=$z dp=2 x tp=2 differs from dp=2 x tp=2 by $d"; exit 1; }
  echo "ok fast zero=$z dp=2 x tp=2: max |loss diff| vs plain dp x tp $d"
done

# zero=3: evaluation and sampling run on gathered units too (sampling keeps all of them)
side() { "$loom" launch -n 2 "$recipe" threads=1 mesh.dp=2 eval.every=10 eval.batches=2 sample.every=20 \
  sample.tokens=24 "$@" 2>/dev/null | grep -av '^\[rank' | grep -av -e '^LOSS' -e '^NORM' -e '^step 20/20' -e '^memory/rank'; }
side > "$tmp/side0"
side strategy.zero=3 > "$tmp/side3"
grep -q 'val loss' "$tmp/side0" || { echo "no evaluation lines"; exit 1; }
cmp -s "$tmp/side0" "$tmp/side3" || { echo "zero=3 evaluation or sample differs from plain dp:"; diff "$tmp/side0" "$tmp/side3" | head; exit 1; }
echo "ok zero=3 dp=2: evaluation losses and the sampled text identical to plain dp ($(grep -c 'val loss' "$tmp/side3") evaluations)"
mkdir -p "$tmp/off" # the same with the parameter partition offloaded (docs/ZERO.md)
side strategy.zero=3 strategy.offload.optimizer=disk strategy.offload.path="$tmp/off" strategy.offload.params=true > "$tmp/side3p"
cmp -s "$tmp/side0" "$tmp/side3p" || { echo "zero=3 offload.params evaluation or sample differs from plain dp:"; diff "$tmp/side0" "$tmp/side3p" | head; exit 1; }
echo "ok zero=3 dp=2 with offload.params (disk): evaluation losses and the sampled text identical to plain dp"

# --- run to run -----------------------------------------------------------------------
runN 2 batch.micro=4 strategy.zero=1 > "$tmp/again1"
cmp -s "$tmp/z1_2" "$tmp/again1" || { echo "zero=1 dp=2 twice differs"; exit 1; }
runN 4 batch.micro=2 strategy.zero=2 $small > "$tmp/again2"
cmp -s "$tmp/z2_4" "$tmp/again2" || { echo "zero=2 dp=4 twice differs"; exit 1; }
runN 2 batch.micro=2 batch.global=8 strategy.zero=2 $small > "$tmp/again3"
cmp -s "$tmp/acc_z2" "$tmp/again3" || { echo "zero=2 dp=2 with accumulation twice differs"; exit 1; }
runN 4 batch.micro=2 strategy.zero=3 > "$tmp/again4"
cmp -s "$tmp/z3_4" "$tmp/again4" || { echo "zero=3 dp=4 twice differs"; exit 1; }
echo "ok zero=1 dp=2, zero=2 dp=4, zero=2 dp=2 with accumulation, zero=3 dp=4, each run twice: bitwise identical"

# --- canonical mode: one set of bits for every stage and layout -----------------------
canon="deterministic=canonical batch.micro=2 batch.global=8"
run1 $canon > "$tmp/c1"
run1 $canon strategy.zero=2 > "$tmp/c1z"   # one dp rank: nothing to partition
finite_losses "$tmp/c1"
cmp -s "$tmp/c1" "$tmp/c1z" || { echo "canonical dp=1 zero=2 differs from dp=1"; exit 1; }
layouts="dp=1"
for n in 2 4; do
  for z in 0 1 2 3; do
    runN $n $canon strategy.zero=$z $small > "$tmp/c_${n}_$z"
    cmp -s "$tmp/c1" "$tmp/c_${n}_$z" ||
      { echo "canonical dp=$n zero=$z differs from dp=1"; paste "$tmp/c1" "$tmp/c_${n}_$z" | head; exit 1; }
    layouts="$layouts, dp=$n zero=$z"
  done
done
for z in 1 2 3; do
  runT $canon strategy.zero=$z $small > "$tmp/ct_$z"
  cmp -s "$tmp/c1" "$tmp/ct_$z" || { echo "canonical dp=2 x tp=2 zero=$z differs from dp=1"; exit 1; }
  layouts="$layouts, dp=2 x tp=2 zero=$z"
done
echo "ok canonical: losses and grad norms bitwise identical over $(grep -c LOSS "$tmp/c1") steps for $layouts"

# --- bf16: the fp32 master partitioned ------------------------------------------------
# the post-step all-gather moves each rank's rounded 16-bit sub-blocks; rounding is
# element-wise, so the same bits as gathering the fp32 master whole and rounding it all
# (zero=1 starts from an llm.c file: loaded into the model's buffer, then the partition).
# The runs (zero_export.lua: losses.lua's, then the weights written whole) end with an
# llm.c save and export_safetensors, the fp32 master gathered for the write: each rank's
# files byte for byte the whole master's
bf="precision=bf16 $small"
"$loom" run "$recipe" threads=1 steps=1 checkpoint.dir="$tmp/llmc" > /dev/null
"$loom" export --llmc "$tmp/llmc" "$tmp/init.bin" > /dev/null
for nz in "2 1 4 model.init=$tmp/init.bin" "3 2 2"; do # ranks, stage, micro-batch (dp=3: the 16-bit tail bucket)
  set -- $nz
  EXPORT_OUT="$tmp/xpart" recipe=$here/recipes/zero_export.lua runN $1 batch.micro=$3 $bf strategy.zero=$2 ${4:-} > "$tmp/bfp"
  EXPORT_OUT="$tmp/xwhole" LOOM_ZERO_MASTER=whole recipe=$here/recipes/zero_export.lua runN $1 batch.micro=$3 $bf strategy.zero=$2 ${4:-} > "$tmp/bfw"
  finite_losses "$tmp/bfw" "$tmp/bfp"
  cmp -s "$tmp/bfw" "$tmp/bfp" || { echo "bf16 zero=$2 dp=$1: the partitioned master differs from the whole one"; paste "$tmp/bfw" "$tmp/bfp" | head; exit 1; }
  for r in $(seq 0 $(($1 - 1))); do
    for f in bin st; do
      [ -s "$tmp/xwhole.rank$r.$f" ] || { echo "bf16 zero=$2 dp=$1: rank $r wrote no .$f with the master whole"; exit 1; }
      cmp "$tmp/xwhole.rank$r.$f" "$tmp/xpart.rank$r.$f" || { echo "bf16 zero=$2 dp=$1: rank $r's .$f from the partitioned master differs from the whole master's"; exit 1; }
    done
  done
  rm -f "$tmp"/x*
done
run1 $canon precision=bf16 > "$tmp/bc1"
finite_losses "$tmp/bc1"
runN 2 $canon $bf strategy.zero=2 > "$tmp/bc2"
cmp -s "$tmp/bc1" "$tmp/bc2" || { echo "canonical bf16 dp=2 zero=2 differs from one rank"; paste "$tmp/bc1" "$tmp/bc2" | head; exit 1; }
echo "ok bf16 with the fp32 master partitioned: zero=1 dp=2 (from an llm.c file) and zero=2 dp=3 bitwise the whole master's losses and norms, and their llm.c save and export_safetensors byte for byte its files; canonical zero=2 dp=2 bitwise one rank"
# dp=2 x tp=2 zero=2, 4 steps: each tp rank's dp group partitions its slices' master
bt="$bf strategy.zero=2 steps=4"
runT $bt > "$tmp/btp"
LOOM_ZERO_MASTER=whole runT $bt > "$tmp/btw"
[ "$(grep -c LOSS "$tmp/btp")" -eq 4 ] || { echo "bf16 dp=2 x tp=2 zero=2: expected 4 steps"; cat "$tmp/btp"; exit 1; }
finite_losses "$tmp/btw" "$tmp/btp"
cmp -s "$tmp/btw" "$tmp/btp" || { echo "bf16 dp=2 x tp=2 zero=2: the partitioned master differs from the whole one"; paste "$tmp/btw" "$tmp/btp"; exit 1; }
grep -E '^(LOSS|NORM) [1-4] ' "$tmp/bc1" > "$tmp/btc1"   # one rank's first 4 steps (the lr schedule is fixed)
runT $canon $bt > "$tmp/btc"
cmp -s "$tmp/btc1" "$tmp/btc" || { echo "canonical bf16 dp=2 x tp=2 zero=2 differs from one rank"; paste "$tmp/btc1" "$tmp/btc"; exit 1; }
echo "ok bf16 with the fp32 master partitioned: dp=2 x tp=2 zero=2 bitwise the whole master's (canonical: one rank's)"

# --- memory by category against the formulas ------------------------------------------
# Ψ from the model's shape (common.lua: V=256, ctx=32, L=2, C=32), not from the code:
# wte + wpe + L blocks of 12C^2 + 13C + ln_f.
psi=$((256 * 32 + 32 * 32 + 2 * (12 * 32 * 32 + 13 * 32) + 2 * 32))
mem() { "$loom" launch -n "$1" "$here/recipes/zero_memory.lua" mesh.dp="$1" strategy.zero="$2" "${@:3}" | sed 's/^\[rank [0-9]*\] //' | grep -a '^MEM '; }
# held N Z W: each rank's MEM line against the formulas, W bytes a compute weight. fp32
# (W = 4): the paper's. bf16 (W = 2, precision=bf16): a 2-byte compute copy (whole under
# every stage), fp32 gradients (4), AdamW (8) and the fp32 master (4, partitioned at every
# stage): 18Ψ, 6Ψ + 12Ψ/N, 2Ψ + 16Ψ/N, 2Ψ + 16Ψ/N. The master is held exactly: 4P/N
# bytes, P = Ψ padded to a multiple of 16N (zero.h).
held() {
  local pad=$(( (psi + 16 * $1 - 1) / (16 * $1) * 16 * $1 ))
  awk -v psi=$psi -v pad=$pad -v n=$1 -v z=$2 -v w=$3 '
      function check(what, got, want) {
        r = got / want
        if (!(r > 0.9 && r < 1.1)) { printf "dp=%d zero=%d %d-byte weights %s: %d bytes, formula %.0f (ratio %.3f)\n", n, z, w, what, got, want, r; bad = 1 }
      }
      { p = $3; g = $4; o = $5; m = $6
        check("params", p, z == 3 && w == 4 ? 4 * psi / n : w * psi)
        check("grads", g, z >= 2 ? 4 * psi / n : 4 * psi)
        check("optimizer", o, z >= 1 ? 8 * psi / n : 8 * psi)
        if (w == 4 && m != 0) { print "master weights under fp32: " m; bad = 1 }
        if (w != 4) check("master", m, z >= 1 ? 4 * psi / n : 4 * psi)
        if (w != 4 && z >= 1 && m != 4 * pad / n) { printf "dp=%d zero=%d bf16 master: %d bytes, 4P/N = %d\n", n, z, m, 4 * pad / n; bad = 1 }
        if (w == 4)
          want = z == 0 ? 16 * psi : z == 1 ? 8 * psi + 8 * psi / n : z == 2 ? 4 * psi + 12 * psi / n : 16 * psi / n
        else
          want = z == 0 ? 18 * psi : z == 1 ? 6 * psi + 12 * psi / n : 2 * psi + 16 * psi / n
        check("model states", p + g + o + m, want)
        got = p + g + o + m; rows++ }
      END {
        if (rows != n) { print "expected " n " MEM lines, got " rows; bad = 1 }
        if (bad) exit 1
        printf "ok memory dp=%d zero=%d %s: %d bytes of model states per rank, formula %.0f (Ψ=%d)\n", n, z, w == 4 ? "fp32" : "bf16", got, want, psi
      }' "$tmp/mem"
}
for n in 2 4; do
  for z in 0 1 2 3; do
    mem $n $z > "$tmp/mem"
    held $n $z 4
  done
done
for nz in "2 1" "2 2" "2 3" "4 3"; do
  mem $nz precision=bf16 > "$tmp/mem"
  held $nz 2
done
# 8 layers: the model computes in full-size buffers whose pages go back to the OS as each
# bucket is reduced (stage 2's gradients) or each unit is done (stage 3's parameters);
# measured with mincore, each must stay under half of its 4Ψ bytes
psi8=$((256 * 32 + 32 * 32 + 8 * (12 * 32 * 32 + 13 * 32) + 2 * 32))
mem8() { "$loom" launch -n 2 "$here/recipes/zero_memory.lua" mesh.dp=2 model.layers=8 "$@" | grep -a '^MEM 0 ' || true; }
resident() { # resident WHAT FIELD: the MEM line on stdin, field FIELD a resident peak
  awk -v what="$1" -v f="$2" -v full=$((4 * psi8)) '
    { n++; if (!($f > 0 && $f < 0.5 * full)) { print what " resident peak " $f " of " full " bytes"; bad = 1; exit 1 }
      printf "ok %s, 8 layers: resident at most %d of %d bytes (%.0f%%)\n", what, $f, full, 100 * $f / full }
    END { if (bad) exit 1; if (n != 1) { print "no MEM line from rank 0"; exit 1 } }'
}
mem8 strategy.zero=2 strategy.dp.bucket_mb=0.01 | resident "stage 2 full gradient buffer" 9
mem8 strategy.zero=3 | resident "stage 3 full parameter buffer" 10

# --- zero=3's partitioned construction (docs/ZERO.md) ---------------------------------
# Each rank draws only its partition of the initial values and never writes the rest of
# the full-size parameter buffer before its first gather. LOOM_ZERO_INIT=whole is the
# construction before (every rank draws the whole model, then keeps its partition): the
# same bits, and a start-up peak of the resident set higher by the whole buffer it wrote.
for n in 2 3; do
  LOOM_ZERO_INIT=whole runN $n batch.micro=$((n == 2 ? 4 : 2)) strategy.zero=3 > "$tmp/z3w_$n"
  finite_losses "$tmp/z3w_$n" "$tmp/z3_$n"
  cmp -s "$tmp/z3w_$n" "$tmp/z3_$n" || { echo "zero=3 dp=$n: partitioned construction differs from the whole model's"; paste "$tmp/z3w_$n" "$tmp/z3_$n" | head; exit 1; }
done
LOOM_ZERO_INIT=whole runT batch.micro=4 strategy.zero=3 $small > "$tmp/tp_z3w"
cmp -s "$tmp/tp_z3w" "$tmp/tp_z3" || { echo "zero=3 dp=2 x tp=2: partitioned construction differs from the whole model's"; exit 1; }
LOOM_ZERO_INIT=whole runN 2 $canon strategy.zero=3 $small > "$tmp/c_2_3w"
cmp -s "$tmp/c_2_3w" "$tmp/c_2_3" || { echo "canonical zero=3 dp=2: partitioned construction differs from the whole model's"; exit 1; }
echo "ok zero=3 partitioned construction: losses and norms bitwise the whole model's (LOOM_ZERO_INIT=whole) at dp=2, dp=3 (the tail), dp=2 x tp=2 and canonical dp=2"
# the start-up peak (VmHWM before step 1, zero_init_rss.lua: 2.7 M parameters, one step;
# MALLOC_PERTURB_ set, as meson sets it): below the whole model's by at least 90% of the
# (N-1)/N of the parameter bytes a rank does not own (measured: by all of the 4 psi bytes,
# since the whole construction also held the partition beside the full buffer)
psiL=$((256 * 192 + 16 * 192 + 6 * (12 * 192 * 192 + 13 * 192) + 2 * 192))
init() { MALLOC_PERTURB_=165 "$loom" launch -n "$1" "$here/recipes/zero_init_rss.lua" mesh.dp="$1" strategy.zero=3 comm_timeout=30 | sed 's/^\[rank [0-9]*\] //' | grep -a -e '^INIT ' -e '^LOSS ' | sort; }
for n in 2 4; do
  init $n > "$tmp/init_p"
  LOOM_ZERO_INIT=whole init $n > "$tmp/init_w"
  cmp -s <(grep LOSS "$tmp/init_p") <(grep LOSS "$tmp/init_w") || { echo "zero=3 dp=$n: the 11 MB model's loss differs between the constructions"; paste "$tmp/init_p" "$tmp/init_w"; exit 1; }
  join <(grep INIT "$tmp/init_p" | cut -d' ' -f2-) <(grep INIT "$tmp/init_w" | cut -d' ' -f2-) |
    awk -v n=$n -v psi=$psiL '
      { r++; want = 0.9 * 4 * psi * (n - 1) / n; d = $3 - $2
        if (!($2 > 0 && d >= want)) { printf "zero=3 dp=%d rank %d: start-up peak %d bytes partitioned, %d whole: %d below, want at least %.0f\n", n, $1, $2, $3, d, want; bad = 1 }
        if ($1 == 0) { p = $2; w = $3 } }
      END { if (r != n) { print "expected " n " INIT lines, got " r; bad = 1 }
        if (bad) exit 1
        printf "ok zero=3 dp=%d partitioned construction (4 psi = %d bytes of parameters): rank 0 start-up peak %d bytes, %d with the whole model drawn (%.1f MB below)\n", n, 4 * psi, p, w, (w - p) / 1e6 }'
done

# --- refusals -------------------------------------------------------------------------
refused() { # refused WANT ARGS...: the run fails, naming WANT, before training
  local want=$1; shift
  if "$@" > "$tmp/ref" 2>&1; then echo "accepted: $*"; exit 1; fi
  grep -q "$want" "$tmp/ref" || { echo "unexpected message for $*:"; cat "$tmp/ref"; exit 1; }
  grep -q '^LOSS' "$tmp/ref" && { echo "trained before refusing: $*"; exit 1; }
  echo "ok refused: $(grep -o "strategy[^|]*" "$tmp/ref" | head -1)"
}
refused "strategy.zero=3 with model.init (llm.c weights) is not built yet" "$loom" launch -n 2 "$recipe" mesh.dp=2 strategy.zero=3 model.init=/nonexistent.bin
refused "must be 0, 1, 2 or 3" "$loom" run "$recipe" strategy.zero=7
