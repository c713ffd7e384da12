#!/usr/bin/env bash
# pp_ckpt.sh LOOM — checkpoints, sampling and loom.gpt{init=} under pipeline parallelism
# (loom launch, shm), on pp.sh's small model (4 blocks, 4 heads), 6 steps with a save at 3:
#  - the same layout resumes bitwise (losses and gradient norms of steps 4-6 equal those
#    of the 6-step run that saved at step 3 as it went; resume=auto finds the checkpoint):
#    pp=2 with 1f1b and with interleaved, pp=2 x dp=2; canonical mode also into another
#    pp_layers split;
#  - a pp=2 checkpoint resumes at pp=1 and pp=4, and a tp=2 x pp=2 one at tp=1 x pp=4,
#    within 2e-5 of one rank's losses (fast mode) and bitwise in canonical mode;
#  - the checkpoint: one file pair per stage, the tied wte only in stage 0's, the
#    manifest recording pp and the split; a damaged stage file is refused by name;
#  - sampling (each stage decoding with its own layers' key/value cache): a pp=2 run's
#    sample and logits hash equal its uncached sample's and those of pp=1 and pp=4 sessions
#    loading its checkpoint, and canonical same-seed runs at pp=1, pp=2 and pp=2 x tp=2
#    sample alike;
#  - loom.gpt{init=}: the llm.c file exported from a pp=2 checkpoint loads into pp=2 and
#    pp=4 stages, canonical losses bitwise one rank's.
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
recipe=$here/recipes/pp_probe.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive   # several ranks share 2 cores: OpenMP must not spin
model="model.heads=4 model.layers=4 threads=1 steps=6"
keep() { grep -E '^(LOSS|NORM) ' || true; }
run() { # ranks args...: LOSS and NORM lines of rank 0
  local n=$1; shift
  if [ "$n" = 1 ]; then "$loom" run "$recipe" $model "$@"; else
    "$loom" launch -n "$n" "$recipe" $model comm_timeout=20 "$@"; fi
}
save3() { # dir ranks args...: train 3 steps, save; prints the checkpoint's path
  local dir=$1; shift
  run "$@" steps=3 checkpoint.dir="$dir" > /dev/null
  echo "$dir/step_00000003"
}
resume() { # ckpt ranks args...: steps 4-6 after resuming from ckpt (a directory of
  local ck=$1 how; shift  # checkpoints: resume=auto, which finds its step 3)
  if [ -f "$ck/manifest.json" ]; then how="resume=$ck"; else how="checkpoint.dir=$ck resume=auto"; fi
  run "$@" $how > "$tmp/out"
  grep -q "resumed from $ck.* at step 3" "$tmp/out" || { echo "did not resume from $ck"; cat "$tmp/out"; exit 1; }
  keep < "$tmp/out"
}
tail3() { awk '$2 > 3' "$1"; }
rel_norm_diff() {
  paste <(grep '^NORM' "$1") <(grep '^NORM' "$2") |
    awk '{ d = ($4 - $8) / $4; if (d < 0) d = -d; if (d > m) m = d } END { printf "%.3g", m + 0 }'
}
bitwise() { # name want got
  [ "$(grep -c '^LOSS' "$3")" -eq 3 ] || { echo "$1: expected steps 4-6"; cat "$3"; exit 1; }
  finite_losses "$2"
  cmp -s "$2" "$3" || { echo "$1: resumed run differs"; paste "$2" "$3"; exit 1; }
  echo "ok $1: steps 4-6 bitwise"
}
close() { # name want got
  [ "$(grep -c '^LOSS' "$3")" -eq 3 ] || { echo "$1: expected steps 4-6"; cat "$3"; exit 1; }
  local d n
  d=$(max_loss_diff "$2" "$3"); n=$(rel_norm_diff "$2" "$3")
  below "$d" 2e-5 || { echo "$1: losses differ from one rank by $d"; paste "$2" "$3"; exit 1; }
  below "$n" 1e-5 || { echo "$1: gradient norms differ from one rank by $n (relative)"; exit 1; }
  echo "ok $1: steps 4-6 within 2e-5 of one rank (max |loss diff| $d, norm rel diff $n)"
}

# The same layout, bitwise.
for layout in "2 mesh.pp=2 schedule=1f1b microbatches=4" "2 mesh.pp=2 schedule=interleaved microbatches=4" \
              "4 mesh.pp=2 mesh.dp=2 microbatches=2"; do
  # the 6-step run saves at step 3 as it goes (its step 6 save dropped, so that resume=auto
  # finds step 3); the resume must give its steps 4-6
  run $layout checkpoint.dir="$tmp/same" checkpoint.every=3 | keep > "$tmp/full"; tail3 "$tmp/full" > "$tmp/want"
  [ -f "$tmp/same/step_00000003/manifest.json" ] || { echo "${layout#* }: no checkpoint at step 3"; exit 1; }
  rm -rf "$tmp/same/step_00000006"
  resume "$tmp/same" $layout > "$tmp/got"   # resume=auto: finding a pp checkpoint
  bitwise "${layout#* } save + resume" "$tmp/want" "$tmp/got"
  rm -rf "$tmp/same"
done

# What a pp=2 checkpoint holds.
ck2=$(save3 "$tmp/pp2" 2 mesh.pp=2 microbatches=4)
ls "$ck2" | tr '\n' ' ' | grep -qx 'manifest.json model.pp0.safetensors model.pp1.safetensors optim.pp0.safetensors optim.pp1.safetensors ' ||
  { echo "pp=2 checkpoint files: $(ls "$ck2")"; exit 1; }
grep -q '"layout": {"tp": 1, "pp": 2, "pp_layers": \[2, 2\]}' "$ck2/manifest.json" ||
  { echo "manifest layout: $(grep layout "$ck2/manifest.json")"; exit 1; }
header() { head -c 4096 "$1" | tr -c '[:print:]' ' '; }
header "$ck2/model.pp0.safetensors" | grep -q '"wte"' || { echo "stage 0 did not write wte"; exit 1; }
header "$ck2/model.pp1.safetensors" | grep -q '"wte"' && { echo "the last stage wrote wte too"; exit 1; }
header "$ck2/optim.pp1.safetensors" | grep -q '"wte\.state' && { echo "the last stage wrote wte's optimizer state"; exit 1; }
header "$ck2/model.pp1.safetensors" | grep -q '"ln_f.weight"' || { echo "the last stage did not write ln_f"; exit 1; }
echo "ok pp=2 checkpoint: a file pair per stage, wte in stage 0's only, manifest layout pp=2 split [2, 2]"

# Other layouts, fast mode: within fp32 rounding of one rank.
run 1 batch.global=16 | keep > "$tmp/one"; tail3 "$tmp/one" > "$tmp/one3"
resume "$ck2" 1 batch.global=16 > "$tmp/got"; close "pp=2 checkpoint resumed at pp=1" "$tmp/one3" "$tmp/got"
resume "$ck2" 4 mesh.pp=4 microbatches=4 > "$tmp/got"; close "pp=2 checkpoint resumed at pp=4" "$tmp/one3" "$tmp/got"
ck22=$(save3 "$tmp/tp2pp2" 4 mesh.tp=2 mesh.pp=2 microbatches=4)
resume "$ck22" 4 mesh.pp=4 microbatches=4 > "$tmp/got"; close "tp=2 x pp=2 checkpoint resumed at tp=1 x pp=4" "$tmp/one3" "$tmp/got"

# Canonical mode: bitwise across the layouts.
canon="deterministic=canonical"
run 1 $canon batch.global=16 checkpoint.dir="$tmp/cpp1" checkpoint.every=3 | keep > "$tmp/c1"; tail3 "$tmp/c1" > "$tmp/c13"
cc2=$(save3 "$tmp/cpp2" 2 $canon mesh.pp=2 microbatches=4)
resume "$cc2" 1 $canon batch.global=16 > "$tmp/got"; bitwise "canonical pp=2 checkpoint resumed at pp=1" "$tmp/c13" "$tmp/got"
resume "$cc2" 2 $canon mesh.pp=2 'pp_layers={1,3}' microbatches=4 > "$tmp/got"
bitwise "canonical pp=2 checkpoint (2 + 2 blocks) resumed at pp_layers={1,3}" "$tmp/c13" "$tmp/got"
resume "$cc2" 4 $canon mesh.pp=4 schedule=gpipe microbatches=4 > "$tmp/got"
bitwise "canonical pp=2 checkpoint resumed at pp=4 (gpipe)" "$tmp/c13" "$tmp/got"
cc22=$(save3 "$tmp/ctp2pp2" 4 $canon mesh.tp=2 mesh.pp=2 microbatches=4)
resume "$cc22" 4 $canon mesh.pp=4 microbatches=4 > "$tmp/got"
bitwise "canonical tp=2 x pp=2 checkpoint resumed at tp=1 x pp=4" "$tmp/c13" "$tmp/got"
cc1=$tmp/cpp1/step_00000003   # saved by the canonical one-rank run above
resume "$cc1" 2 $canon mesh.pp=2 microbatches=4 > "$tmp/got"; bitwise "canonical pp=1 checkpoint resumed at pp=2" "$tmp/c13" "$tmp/got"

# A damaged stage file is refused by name before any training.
cp -r "$tmp/pp2" "$tmp/bad"
truncate -s 100 "$tmp/bad/step_00000003/model.pp1.safetensors"
if "$loom" launch -n 2 "$recipe" $model comm_timeout=20 mesh.pp=2 microbatches=4 resume="$tmp/bad/step_00000003" > "$tmp/err" 2>&1; then
  echo "damaged pp checkpoint accepted"; exit 1
fi
grep -q "model.pp1.safetensors" "$tmp/err" || { echo "refusal does not name the file:"; cat "$tmp/err"; exit 1; }
grep -q '^LOSS' "$tmp/err" && { echo "trained before refusing"; exit 1; }
echo "ok damaged stage file refused: $(grep -o 'cannot resume.*' "$tmp/err" | head -1 | cut -c1-120)"

# Sampling through the stages: the same text and logits as one rank from the checkpoint.
srec=$here/recipes/pp_sample.lua
sm="model.heads=4 model.layers=4 comm_timeout=20"
# Under pp the sample decodes with each stage's key/value cache (one row between stages per
# token); LOOM_SAMPLE_TIMES=1 samples once more with and once without it (NOCACHE lines:
# the same text and logits) and times both.
LOOM_SAMPLE_TIMES=1 "$loom" launch -n 2 "$srec" $sm mesh.pp=2 microbatches=4 checkpoint.dir="$tmp/s2" > "$tmp/sout"
grep -E '^(SAMPLE|HASH)' "$tmp/sout" > "$tmp/sa"
[ "$(wc -l < "$tmp/sa")" -eq 2 ] || { echo "no sample at pp=2"; cat "$tmp/sa"; exit 1; }
sed -n 's/^NOCACHE //p' "$tmp/sout" > "$tmp/snc"
cmp -s "$tmp/sa" "$tmp/snc" || { echo "pp=2: the sample without the cache differs"; paste "$tmp/sa" "$tmp/snc"; exit 1; }
echo "ok pp=2 sample with the stages' key/value caches = without them; ms cached, uncached: $(sed -n 's/^TIMES //p' "$tmp/sout")"
"$loom" run "$srec" $sm batch.global=16 resume="$tmp/s2/step_00000004" | grep -E '^(SAMPLE|HASH)' > "$tmp/sb"
cmp -s "$tmp/sa" "$tmp/sb" || { echo "pp=2 sample differs from pp=1's from its checkpoint"; paste "$tmp/sa" "$tmp/sb"; exit 1; }
"$loom" launch -n 4 "$srec" $sm mesh.pp=4 microbatches=4 resume="$tmp/s2/step_00000004" | grep -E '^(SAMPLE|HASH)' > "$tmp/sc"
cmp -s "$tmp/sa" "$tmp/sc" || { echo "pp=4 sample differs from pp=2's"; paste "$tmp/sa" "$tmp/sc"; exit 1; }
echo "ok 40-token sample: pp=2, and pp=1 and pp=4 from its checkpoint, the same text and logits ($(sed -n 's/^HASH //p' "$tmp/sa"))"
# Same-seed runs in canonical mode train the same bits at pp=1 and pp=2, so sample alike.
"$loom" run "$srec" $sm batch.global=16 deterministic=canonical | grep -E '^(SAMPLE|HASH)' > "$tmp/sd"
"$loom" launch -n 2 "$srec" $sm mesh.pp=2 microbatches=4 deterministic=canonical | grep -E '^(SAMPLE|HASH)' > "$tmp/se"
[ "$(wc -l < "$tmp/sd")" -eq 2 ] || { echo "no canonical sample at pp=1"; exit 1; }
cmp -s "$tmp/sd" "$tmp/se" || { echo "canonical same-seed samples differ at pp=2"; paste "$tmp/sd" "$tmp/se"; exit 1; }
"$loom" launch -n 4 "$srec" $sm mesh.pp=2 mesh.tp=2 microbatches=4 deterministic=canonical | grep -E '^(SAMPLE|HASH)' > "$tmp/se"
cmp -s "$tmp/sd" "$tmp/se" || { echo "canonical same-seed samples differ at pp=2 x tp=2"; paste "$tmp/sd" "$tmp/se"; exit 1; }
echo "ok canonical same-seed runs at pp=1, pp=2 and pp=2 x tp=2: the same sample and logits"

# loom.gpt{init=}: an llm.c file exported from the pp=2 checkpoint, loaded into stages.
"$loom" export --llmc "$ck2" "$tmp/m.bin" > /dev/null
init="model.init=$tmp/m.bin $canon"
run 1 $init batch.global=16 | keep > "$tmp/i1"
run 1 $canon batch.global=16 | keep > "$tmp/fresh"
[ "$(head -1 "$tmp/i1")" != "$(head -1 "$tmp/fresh")" ] || { echo "loom.gpt{init=} did not change the first loss"; exit 1; }
for layout in "2 mesh.pp=2 microbatches=4" "4 mesh.pp=4 microbatches=4"; do
  run $layout $init | keep > "$tmp/i"
  finite_losses "$tmp/i1"
  cmp -s "$tmp/i1" "$tmp/i" || { echo "init at ${layout#* } differs from one rank"; paste "$tmp/i1" "$tmp/i"; exit 1; }
  echo "ok llm.c init at ${layout#* }: canonical losses and norms of 6 steps bitwise one rank's"
done
