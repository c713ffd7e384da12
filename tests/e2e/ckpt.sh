#!/usr/bin/env bash
# ckpt.sh LOOM — `loom ckpt info` and `loom ckpt export`, and loads that read only what a
# rank holds, on pp.sh's small model (4 blocks, 4 heads), 3 steps in canonical mode:
#  - export from a tp=2 x pp=2 checkpoint and from one rank's checkpoint of the same run:
#    both files are valid safetensors (checked by a reader written here with python3's
#    json and struct only), hold every parameter once (wte once) under its logical name
#    and shape, and every tensor's bytes equal one rank's model.safetensors tensor;
#  - info prints step, layout, optimizer slots, data position, files and every tensor's
#    logical shape and slices, after verifying every checksum; a damaged byte in a data chunk or a
#    changed manifest makes it exit 1 naming the file;
#  - resuming one rank's checkpoint of a wider model at tp=2 (LOOM_CKPT_STATS=1): each
#    rank reads about half of it (45% to 55%);
#  - help for ckpt, ckpt info and ckpt export; an unknown subcommand is refused.
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
recipe=$here/recipes/pp_probe.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive   # several ranks share 2 cores: OpenMP must not spin
model="model.heads=4 model.layers=4 threads=1 steps=3 deterministic=canonical"
fail() { echo "FAIL: $*"; exit 1; }

"$loom" run "$recipe" $model batch.global=16 checkpoint.dir="$tmp/one" > "$tmp/log1" 2>&1 ||
  { cat "$tmp/log1"; fail "one-rank run"; }
"$loom" launch -n 4 "$recipe" $model comm_timeout=20 mesh.tp=2 mesh.pp=2 microbatches=4 \
  checkpoint.dir="$tmp/tp2pp2" > "$tmp/log4" 2>&1 || { cat "$tmp/log4"; fail "tp=2 x pp=2 run"; }
one=$tmp/one/step_00000003

# --- export -------------------------------------------------------------------------
"$loom" ckpt export "$tmp/tp2pp2" "$tmp/a.safetensors"
"$loom" ckpt export "$one" "$tmp/b.safetensors"
python3 - "$tmp/a.safetensors" "$tmp/b.safetensors" "$one/model.safetensors" <<'EOF'
import json, struct, sys
SIZES = {"F32": 4, "BF16": 2, "F16": 2, "I32": 4, "U8": 1}
def read(path):
    """A strict reader of the safetensors format: name -> (dtype, shape, bytes)."""
    raw = open(path, "rb").read()
    assert len(raw) >= 8, f"{path}: shorter than the header length"
    (n,) = struct.unpack("<Q", raw[:8])
    assert 8 + n <= len(raw), f"{path}: header length {n} runs past the end"
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    assert all(isinstance(v, str) for v in meta.values()), f"{path}: non-string metadata"
    out, spans = {}, []
    for name, t in header.items():
        assert set(t) == {"dtype", "shape", "data_offsets"}, f"{path}: {name}: members {set(t)}"
        a, b = t["data_offsets"]
        numel = 1
        for d in t["shape"]:
            numel *= d
        assert b - a == numel * SIZES[t["dtype"]], f"{path}: {name}: offsets do not fit the shape"
        spans.append((a, b))
        out[name] = (t["dtype"], t["shape"], data[a:b])
    spans.sort()
    at = 0
    for a, b in spans:  # the spec: no holes, no overlaps, the data section exactly covered
        assert a == at, f"{path}: a hole or overlap at data byte {at}"
        at = b
    assert at == len(data), f"{path}: {len(data) - at} bytes after the last tensor"
    return out, meta
a, meta_a = read(sys.argv[1])
b, _ = read(sys.argv[2])
ref, ref_meta = read(sys.argv[3])
assert meta_a.get("format") == "pt" and "loom.model" in meta_a, meta_a.keys()
assert set(a) == set(b) == set(ref), (set(a) ^ set(ref))
assert "wte" in a and not any(k.startswith("lm_head") for k in a), "wte once, no separate head"
for name, (dt, shape, raw) in ref.items():
    layout = json.loads(ref_meta[name])
    assert layout["shape"] == shape and layout["slice_start"] == [0] * len(shape), name
    for what, got in (("tp=2 x pp=2 export", a), ("one-rank export", b)):
        assert got[name][0] == dt and got[name][1] == shape, f"{what}: {name}: {got[name][:2]}"
        assert got[name][2] == raw, f"{what}: {name}: bytes differ from one rank's tensor"
print(f"ok export: {len(a)} tensors, tp=2 x pp=2 and one-rank exports bitwise one rank's "
      f"model.safetensors ({sum(len(v[2]) for v in a.values())} bytes)")
EOF

# --- info -----------------------------------------------------------------------------
"$loom" ckpt info "$tmp/tp2pp2" > "$tmp/info"
for want in "step 3 (" "layout: tp=2 pp=2, blocks per virtual stage 2,2" \
    "optimizer: adamw, 2 state slots per parameter" "data position: text" \
    "model.pp1.tp1.safetensors" "optim tensors (104" "checksums verified:"; do
  grep -qF "$want" "$tmp/info" || { cat "$tmp/info"; fail "ckpt info lacks '$want'"; }
done
grep -qE '^  h\.0\.attn\.proj\.weight +\[32, 32\] +F32 +model\.pp0\.tp0\.safetensors \[0:32, 0:16\]; model\.pp0\.tp1\.safetensors \[0:32, 16:32\]$' "$tmp/info" ||
  fail "ckpt info does not show proj.weight's logical shape and tp slices"
grep -qE '^  wte +\[256, 32\] +F32 +model\.pp0\.tp0' "$tmp/info" || fail "ckpt info: wte"
grep -q 'pp1.*wte\|wte .*pp1' "$tmp/info" && fail "ckpt info: wte in stage 1's files"
echo "ok info: $(grep -c '^  ' "$tmp/info") lines of files and tensors; $(tail -1 "$tmp/info")"
cp -r "$tmp/tp2pp2/step_00000003" "$tmp/bad"
f=$tmp/bad/optim.pp1.tp1.safetensors
printf 'Z' | dd of="$f" bs=1 seek=$(( $(stat -c %s "$f") - 200 )) conv=notrunc status=none
if "$loom" ckpt info "$tmp/bad" > "$tmp/out" 2>&1; then fail "ckpt info accepted a damaged file"; fi
grep -q "optim.pp1.tp1.safetensors.*the file was changed or damaged" "$tmp/out" ||
  { cat "$tmp/out"; fail "ckpt info's refusal does not name the file and why"; }
echo "ok damaged file: $(head -1 "$tmp/out" | cut -c1-160)"
cp -r "$tmp/tp2pp2/step_00000003" "$tmp/bad2"
sed -i 's/"steps_taken": 3/"steps_taken": 4/' "$tmp/bad2/manifest.json"
if "$loom" ckpt info "$tmp/bad2" > "$tmp/out" 2>&1; then fail "ckpt info accepted a changed manifest"; fi
grep -q "manifest.json.*checksum" "$tmp/out" || { cat "$tmp/out"; fail "changed manifest: $(cat "$tmp/out")"; }
echo "ok changed manifest refused"

# --- ranged loads -------------------------------------------------------------------
# A wider model (C=256, 20 MB of checkpoint), saved by one rank and resumed at tp=2: each
# rank reads its half of the split tensors (row splits: qkv, fc, wte; column splits: the
# proj weights) and the small replicated ones whole: about half.
wide="model.dim=256 model.heads=4 model.layers=2 threads=1"
"$loom" run "$recipe" $wide steps=1 checkpoint.dir="$tmp/wide" > "$tmp/r" 2>&1 || { cat "$tmp/r"; fail "wide run"; }
LOOM_CKPT_STATS=1 "$loom" launch -n 2 "$recipe" $wide comm_timeout=20 mesh.tp=2 steps=2 \
  resume="$tmp/wide/step_00000001" > "$tmp/r" 2>&1 || { cat "$tmp/r"; fail "resume at tp=2"; }
stats=$(grep -ao 'read [0-9]* of [0-9]* bytes' "$tmp/r") || { cat "$tmp/r"; fail "no LOOM_CKPT_STATS line"; }
[ "$(wc -l <<<"$stats")" = 2 ] || fail "expected one stats line per rank: $stats"
while read -r _ got _ total _; do
  awk -v g="$got" -v t="$total" 'BEGIN { exit !(g > 0.45 * t && g < 0.55 * t) }' ||
    fail "a tp=2 rank read $got of $total bytes of a one-rank checkpoint (about half expected)"
done <<<"$stats"
echo "ok ranged: one-rank checkpoint into tp=2: $(tr '\n' ';' <<<"$stats")"

# --- help and refusals --------------------------------------------------------------
# (the output is taken whole first: grep -q stopping early would break the pipe)
out=$("$loom" ckpt --help); grep -q "usage: loom ckpt info CKPT" <<<"$out" || fail "loom ckpt --help"
out=$("$loom" ckpt info -h); grep -q "^usage: loom ckpt info CKPT$" <<<"$out" || fail "loom ckpt info -h"
out=$("$loom" ckpt export -h)
grep -q "^usage: loom ckpt export CKPT OUT.safetensors$" <<<"$out" || fail "loom ckpt export -h"
if "$loom" ckpt frob "$one" > "$tmp/out" 2>&1; then fail "unknown subcommand accepted"; fi
grep -q "unknown subcommand 'frob' (info or export)" "$tmp/out" || fail "refusal: $(cat "$tmp/out")"
if "$loom" ckpt info "$tmp/nothing" > "$tmp/out" 2>&1; then fail "info of a missing dir succeeded"; fi
echo "ok help and refusals ($(head -1 "$tmp/out" | cut -c1-100))"
