#!/usr/bin/env bash
# cuda_profile.sh LOOM BACKEND — LOOM_CUDA_PROFILE (kernels/cuda/profile.h) on a session of
# recipes/cuda_train.lua (a 1-block model, 3 steps, AdamW):
#  - the profiled run's losses and norms are the unprofiled run's, bit for bit (events on
#    the stream change no result);
#  - the JSONL file has a row per (op, shape): the counts the model implies (layernorm_forward
#    3 a step for one block, one matmul_forward row per forward product's shape, once a step
#    each, adamw_update once a tensor a step), every time finite and >= 0, the spans the sum
#    of the calls, the device time no more than the first-to-last time, and the total row
#    says complete;
#  - in bf16 the blocks' products are matmul_forward_dt rows, and in canonical mode (the
#    ordered GEMM launched inside the product) still one row per product, not the kernel's;
#  - "%r" in the path becomes the rank; LOOM_CUDA_PROFILE=1 logs the table; an unwritable
#    path is refused when the backend opens, naming it.
# BACKEND cudaemu runs everywhere (the times are the emulation's CPU time); cuda needs a GPU
# (exit 77 where none is visible).
set -euo pipefail
loom=$1 backend=$2
here=$(cd "$(dirname "$0")" && pwd)
recipe=$here/recipes/cuda_train.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
steps=3

if ! "$loom" run "$recipe" backend="$backend" steps=$steps > "$tmp/plain" 2> "$tmp/plain.err"; then
  if grep -q "not usable here\|no CUDA device" "$tmp/plain.err"; then
    echo "SKIP: no GPU here, backend=$backend did not train: $(head -1 "$tmp/plain.err")"
    exit 77
  fi
  cat "$tmp/plain.err"; exit 1
fi
LOOM_CUDA_PROFILE="$tmp/prof.%r.jsonl" "$loom" run "$recipe" backend="$backend" steps=$steps \
  > "$tmp/prof" 2> "$tmp/prof.err" || { cat "$tmp/prof.err"; exit 1; }
[[ -s $tmp/prof.0.jsonl ]] || { echo "no profile written at prof.%r.jsonl with rank 0"; ls "$tmp"; exit 1; }
if ! cmp -s <(grep -E '^(LOSS|NORM) ' "$tmp/plain") <(grep -E '^(LOSS|NORM) ' "$tmp/prof") ||
   ! grep -q "^LOSS $steps " "$tmp/prof"; then
  echo "the profiled run's losses or norms differ from the plain run's:"
  diff <(grep -E '^(LOSS|NORM) ' "$tmp/plain") <(grep -E '^(LOSS|NORM) ' "$tmp/prof") || true
  exit 1
fi

# check FILE PRODUCT [SHAPES]: the rows' contract (above); PRODUCT is the forward products'
# op name; SHAPES "all" (default) the blocks' four products, "columns" only qkv and fc
# (canonical mode runs the row-parallel projections as banded gemm calls of the model's)
check() {
  python3 - "$1" "$2" "$steps" "${3:-all}" <<'EOF'
import json, math, sys
path, product, steps, shapes = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rows = [json.loads(l) for l in open(path)]
totals = [r for r in rows if r.get("total")]
ops = [r for r in rows if not r.get("total")]
bad = []
if len(totals) != 1:
    bad.append(f"{len(totals)} total rows, want 1")
    print("\n".join(bad)); sys.exit(1)
t = totals[0]
for r in ops:
    if not (isinstance(r["ms"], (int, float)) and math.isfinite(r["ms"]) and r["ms"] >= 0):
        bad.append(f"row {r}: ms not a finite time >= 0")
    if r["calls"] <= 0:
        bad.append(f"row {r}: no calls")
if t["spans"] != sum(r["calls"] for r in ops):
    bad.append(f"spans {t['spans']} != the calls' sum {sum(r['calls'] for r in ops)}")
if not (t["device_ms"] > 0 and t["device_ms"] <= t["first_to_last_ms"] * 1.0001 + 1e-3):
    bad.append(f"device_ms {t['device_ms']} not in (0, first_to_last_ms {t['first_to_last_ms']}]")
if t["complete"] is not True or t["entries"] != len(ops):
    bad.append(f"total row {t}: not complete, or entries != {len(ops)}")
def calls(op, **shape):
    return sum(r["calls"] for r in ops if r["op"] == op and all(r[k] == v for k, v in shape.items()))
C, V, L = 32, 256, 1
want = {("layernorm_forward", ()): steps * (2 * L + 1),
        ("adamw_update", ()): steps * (2 + 12 * L + 2)}
for (op, _), n in want.items():
    if calls(op) != n:
        bad.append(f"{op}: {calls(op)} calls, want {n}")
# the blocks' products (qkv, fc; the attention and fc projections), once a step each
products = [(3 * C, C), (4 * C, C)] + ([(C, C), (C, 4 * C)] if shapes == "all" else [])
for oc, k in products:
    n = calls(product, n=oc, k=k)
    if n != steps:
        bad.append(f"{product} {oc}x{k}: {n} calls, want {steps}")
# outermost wins: the ordered GEMM's own launch never shows beside a product
for r in ops:
    if r["op"].startswith("gemm_ordered") or r["op"].startswith("sgemm_ordered"):
        bad.append(f"a kernel inside a product has its own row: {r}")
if bad:
    print("\n".join(bad)); print("rows:"); print("\n".join(json.dumps(r) for r in rows)); sys.exit(1)
print(f"{path}: {len(ops)} rows, {t['spans']} spans, device {t['device_ms']:.3f} ms of "
      f"{t['first_to_last_ms']:.3f} ms, products as {product}")
EOF
}
check "$tmp/prof.0.jsonl" matmul_forward

LOOM_CUDA_PROFILE="$tmp/bf16.jsonl" "$loom" run "$recipe" backend="$backend" steps=$steps \
  precision=bf16 > /dev/null 2> "$tmp/bf16.err" || { cat "$tmp/bf16.err"; exit 1; }
check "$tmp/bf16.jsonl" matmul_forward_dt
LOOM_CUDA_PROFILE="$tmp/canon.jsonl" "$loom" run "$recipe" backend="$backend" steps=$steps \
  deterministic=canonical > /dev/null 2> "$tmp/canon.err" || { cat "$tmp/canon.err"; exit 1; }
check "$tmp/canon.jsonl" matmul_forward columns

LOOM_CUDA_PROFILE=1 "$loom" run "$recipe" backend="$backend" steps=1 > /dev/null 2> "$tmp/log"
grep -q "cuda profile: .* layernorm_forward" "$tmp/log" &&
  grep -q "cuda profile: .* on the device in .* spans" "$tmp/log" ||
  { echo "LOOM_CUDA_PROFILE=1 logged no table:"; cat "$tmp/log"; exit 1; }

if LOOM_CUDA_PROFILE="$tmp/no/such/dir/p.jsonl" "$loom" run "$recipe" backend="$backend" \
     steps=1 > /dev/null 2> "$tmp/bad"; then
  echo "an unwritable LOOM_CUDA_PROFILE path was accepted"; exit 1
fi
grep -q "LOOM_CUDA_PROFILE=.*cannot open .*no/such/dir/p.jsonl" "$tmp/bad" ||
  { echo "the refusal does not name the path:"; cat "$tmp/bad"; exit 1; }
echo "cuda_profile: ok"
