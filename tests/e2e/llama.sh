#!/usr/bin/env bash
# llama.sh LOOM — the llama family (loom.llama: RMSNorm, SwiGLU, RoPE, grouped-query
# attention with 4 query heads over 2 kv heads) under the layouts built for it:
#  - one rank trains (the loss falls over 12 steps);
#  - fast mode: tp=2, with and without sequence parallelism, and pp=2 zb1 (the split
#    backward, 2 micro-batches) within 2e-5 of one rank; pp=2 zb1 bitwise pp=2 1f1b;
#  - canonical mode: tp=2, tp=2+sp, dp=2, tp=2 x dp=2, zero=1/2/3 (dp=2), pp=2 (1f1b,
#    gpipe, zb1, zb1 with selective recompute), pp=2 x tp=2 (1f1b, zb1), pp=2 x dp=2,
#    recompute full and selective, all bitwise identical
#    (losses and gradient norms) to one rank; tp=4 with kv_heads=4 and pp=2 interleaved on
#    4 blocks bitwise their own one-rank runs;
#  - checkpoints remap across layouts by logical names (canonical: bitwise resumes), and
#    export to the same Hugging Face tensors from tp=2 as from one rank;
#  - a tied head (tie_embeddings = true) under pp=2 1f1b and zb1: canonical bitwise one rank;
#  - refused with a message saying what works: tp not dividing kv_heads, an llm.c export.
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
recipe=$here/recipes/llama_losses.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive
base="steps=12 threads=1"
run1() { "$loom" run "$recipe" $base "$@" | grep -E '^(LOSS|NORM)'; }
runN() { local n=$1; shift; "$loom" launch -n "$n" "$recipe" $base comm_timeout=20 "$@" | grep -E '^(LOSS|NORM)'; }

run1 > "$tmp/one"
[ "$(grep -c '^LOSS' "$tmp/one")" -eq 12 ] || { echo "one rank: expected 12 steps"; exit 1; }
fell=$(loss_fell "$tmp/one" 1.0) || { echo "one rank: the loss did not fall by 1.0: $fell"; exit 1; }
echo "ok one rank: 12 steps, loss $fell"
for layout in "mesh.tp=2" "mesh.tp=2 tp_sequence_parallel=true"; do
  runN 2 $layout > "$tmp/f"
  [ "$(grep -c '^LOSS' "$tmp/f")" -eq 12 ] || { echo "fast $layout: expected 12 steps"; exit 1; }
  d=$(max_loss_diff "$tmp/one" "$tmp/f")
  below "$d" 2e-5 || { echo "fast $layout differs from one rank by $d"; exit 1; }
  echo "ok fast $layout vs one rank: max |loss diff| $d over 12 steps"
done
# zb1: B (input gradients) then W (weight gradients) per micro-batch; the same global batch
# of 4 sequences as one rank, in 2 micro-batches of 2
runN 2 mesh.pp=2 schedule=zb1 batch.micro=2 batch.global=4 > "$tmp/z"
[ "$(grep -c '^LOSS' "$tmp/z")" -eq 12 ] || { echo "fast pp=2 zb1: expected 12 steps"; exit 1; }
d=$(max_loss_diff "$tmp/one" "$tmp/z")
below "$d" 2e-5 || { echo "fast pp=2 zb1 differs from one rank by $d"; exit 1; }
runN 2 mesh.pp=2 schedule=1f1b batch.micro=2 batch.global=4 > "$tmp/o"
cmp -s "$tmp/o" "$tmp/z" || { echo "fast pp=2 zb1 differs from 1f1b"; paste "$tmp/o" "$tmp/z" | head; exit 1; }
echo "ok fast mesh.pp=2 schedule=zb1 vs one rank: max |loss diff| $d over 12 steps; bitwise 1f1b"

canon="deterministic=canonical batch.micro=2 batch.global=4"
run1 $canon > "$tmp/c1"
finite_losses "$tmp/c1"
same() { # name file
  cmp -s "$tmp/c1" "$2" || { echo "canonical $1 differs from one rank"; paste "$tmp/c1" "$2" | head; exit 1; }
  echo "ok canonical $1: losses and gradient norms bitwise identical to one rank ($(grep -c '^LOSS' "$2") steps)"
}
for layout in "2 mesh.tp=2" "2 mesh.tp=2 tp_sequence_parallel=true" "2 mesh.dp=2" \
              "4 mesh.tp=2 mesh.dp=2" "2 mesh.dp=2 strategy.zero=1" "2 mesh.dp=2 strategy.zero=2" \
              "2 mesh.dp=2 strategy.zero=3" "2 mesh.pp=2 schedule=1f1b" "2 mesh.pp=2 schedule=gpipe" \
              "2 mesh.pp=2 schedule=zb1" "2 mesh.pp=2 schedule=zb1 recompute=selective" \
              "4 mesh.pp=2 mesh.tp=2 schedule=1f1b" "4 mesh.pp=2 mesh.tp=2 schedule=zb1" \
              "4 mesh.pp=2 mesh.dp=2 schedule=1f1b"; do
  runN ${layout%% *} $canon ${layout#* } > "$tmp/c"
  same "${layout#* }" "$tmp/c"
done
for rc in full selective; do
  run1 $canon recompute=$rc > "$tmp/c"
  same "recompute=$rc" "$tmp/c"
done
# Checkpoints by logical names: saved at tp=2, resumed at one rank; saved at one rank,
# resumed at tp=2 x dp=2: steps 7-12 bitwise the straight run's; the tp=2 checkpoint
# exports (Hugging Face layout) to the same bytes as the one-rank one.
runN 2 $canon mesh.tp=2 steps=6 checkpoint.dir="$tmp/ck2" checkpoint.every=6 > /dev/null
awk '$2 > 6' "$tmp/c1" > "$tmp/want"
run1 $canon resume="$tmp/ck2/step_00000006" > "$tmp/r"
cmp -s "$tmp/want" "$tmp/r" || { echo "saved at tp=2, resumed at one rank: differs"; paste "$tmp/want" "$tmp/r" | head; exit 1; }
run1 $canon steps=6 checkpoint.dir="$tmp/ck1" checkpoint.every=6 > /dev/null
runN 4 $canon mesh.tp=2 mesh.dp=2 resume="$tmp/ck1/step_00000006" > "$tmp/r"
cmp -s "$tmp/want" "$tmp/r" || { echo "saved at one rank, resumed at tp=2 x dp=2: differs"; exit 1; }
runN 2 $canon mesh.pp=2 schedule=1f1b resume="$tmp/ck1/step_00000006" > "$tmp/r"
cmp -s "$tmp/want" "$tmp/r" || { echo "saved at one rank, resumed at pp=2: differs"; exit 1; }
runN 2 $canon mesh.pp=2 schedule=1f1b steps=6 checkpoint.dir="$tmp/ckp" checkpoint.every=6 > /dev/null
run1 $canon resume="$tmp/ckp/step_00000006" > "$tmp/r"
cmp -s "$tmp/want" "$tmp/r" || { echo "saved at pp=2, resumed at one rank: differs"; exit 1; }
echo "ok canonical: saved at tp=2 -> one rank, one rank -> tp=2 x dp=2 and pp=2, pp=2 -> one rank: steps 7-12 bitwise"
mkdir "$tmp/hf1" "$tmp/hf2"
"$loom" ckpt export "$tmp/ck1" "$tmp/hf1/model.safetensors" > /dev/null
"$loom" ckpt export "$tmp/ck2" "$tmp/hf2/model.safetensors" > /dev/null
cmp -s "$tmp/hf1/config.json" "$tmp/hf2/config.json" || { echo "config.json of the tp=1 and tp=2 exports differ"; exit 1; }
# the files differ only in __metadata__'s loom.source path: compare the tensor bytes
tensors() { local n; n=$(od -An -t u8 -N8 "$1" | tr -d ' '); tail -c +$((9 + n)) "$1"; }
tensors "$tmp/hf1/model.safetensors" > "$tmp/t1"; tensors "$tmp/hf2/model.safetensors" > "$tmp/t2"
[ "$(stat -c %s "$tmp/t1")" -gt 100000 ] || { echo "export: tensor bytes missing"; exit 1; }
cmp -s "$tmp/t1" "$tmp/t2" || { echo "the tp=1 and tp=2 exports' tensors differ"; exit 1; }
echo "ok loom ckpt export: the tp=2 checkpoint's Hugging Face export has the one-rank one's tensors"
if "$loom" export --llmc "$tmp/ck1" "$tmp/x.bin" > "$tmp/err" 2>&1 || ! grep -q "GPT-2 blocks only" "$tmp/err"; then
  echo "loom export --llmc of a llama checkpoint was not refused as expected"; cat "$tmp/err"; exit 1
fi
echo "ok refused loom export --llmc of a llama checkpoint"

run1 $canon model.kv_heads=4 > "$tmp/c1"
runN 4 $canon model.kv_heads=4 mesh.tp=4 > "$tmp/c"
same "tp=4 (kv_heads=4)" "$tmp/c"
run1 $canon model.layers=4 > "$tmp/c1"
runN 2 $canon model.layers=4 mesh.pp=2 schedule=interleaved pp_chunks=2 > "$tmp/c"
same "pp=2 interleaved, 2 chunks (4 blocks)" "$tmp/c"

expect_refusal() { # pattern, then the run's arguments
  local want=$1; shift
  if "$loom" run "$recipe" $base "$@" > "$tmp/err" 2>&1; then echo "accepted: $*"; exit 1; fi
  grep -q -- "$want" "$tmp/err" || { echo "refusal of '$*' does not say '$want':"; cat "$tmp/err"; exit 1; }
  echo "ok refused $*: $(tail -1 "$tmp/err" | cut -c1-150)"
}
expect_refusal "does not divide kv_heads=2 (tp may be 1, 2)" mesh.tp=4
# a tied head under pp: wte on the first stage and the head's copy on the last, their two
# gradient halves summed as GPT-2's are; bitwise one rank in canonical mode, zb1 included
tied="$canon model.tie_embeddings=true"
run1 $tied > "$tmp/c1"
for s in 1f1b zb1; do
  runN 2 $tied mesh.pp=2 schedule=$s > "$tmp/c"
  same "pp=2 $s with tie_embeddings = true" "$tmp/c"
done

# scripts/bench-llama's loom side (bench_llama.lua through bench_gpt.lua): the llama model
# it names (one block: 229,760 parameters with the tied head), its JSON line with a CPU time
out=$("$loom" run "$here/../../scripts/recipes/bench_llama.lua" model.layers=1 batch.micro=2 \
  steps=4 threads=1 2>/dev/null | tail -1)
grep -q '^{"impl":"loom",.*"params":229760,.*"cpu_ms_per_step":[0-9]' <<< "$out" ||
  { echo "bench_llama.lua: not the JSON line of a 229760-parameter llama: $out"; exit 1; }
echo "ok bench_llama.lua: the llama benchmark model and its JSON line"

# The bundled recipe runs as written (shape, optimizer, schedule, eval, the closing sample)
# for two small steps on random GPT-2 token shards made here: 10.06M parameters, a first
# loss near ln(50257) = 10.8, and a sample printed.
python3 - "$tmp" <<'PY'
import struct, random, sys
random.seed(3)
for name, n in (("train_000000.bin", 4096), ("val_000000.bin", 2048)):
    header = [20240520, 1, n] + [0] * 253
    with open(f"{sys.argv[1]}/{name}", "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{n}H", *[random.randrange(50257) for _ in range(n)]))
PY
out=$("$loom" run "$here/../../scripts/recipes/llama_shakespeare.lua" steps=1 batch.micro=2 \
  eval.batches=1 data.train="$tmp/train_*.bin" data.val="$tmp/val_*.bin" 2>&1) || { echo "$out"; exit 1; }
grep -qF "llama 10.06M params (L=4 H=4 C=96 V=50257 ctx=64)" <<< "$out" || { echo "not the 10M llama:"; echo "$out"; exit 1; }
loss=$(echo "$out" | grep -o 'trained: loss [0-9.]*' | awk '{print $3}')
awk -v l="$loss" 'BEGIN { exit !(l == l + 0 && l > 10 && l < 11.7) }' ||
  { echo "first loss '$loss' is not near ln(50257) = 10.8"; echo "$out"; exit 1; }
grep -q -- "---- sample ----" <<< "$out" || { echo "no sample"; echo "$out"; exit 1; }
echo "ok llama_shakespeare.lua: 10.06M parameters, first loss $loss, sampled"
