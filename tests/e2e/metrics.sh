#!/usr/bin/env bash
# metrics.sh LOOM — what a run shows (scripts/loom/metrics.lua, `loom plot`):
#  - the progress line: kept every `every` steps and at the last, plain text into a pipe,
#    redrawn in place (\r, clear to end of line) on a terminal (if `script` can fake one);
#  - the JSONL file: parent dirs created, every line strict JSON (no NaN/Infinity), the
#    required keys with their types, mfu a number with a peak and null without;
#  - the peak FLOP/s table matches whole names (A100 is not "RTX A1000"), unknown keys refused;
#  - `loom plot` writes an SVG that parses as XML and has its panels, and refuses a
#    missing, empty or garbage file naming the file and line (tests/e2e/plot.sh has the rest).
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
recipe=$here/recipes/metrics.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# Progress line into a pipe: steps 2, 4, 6 kept, no control characters.
"$loom" run "$recipe" steps=6 every=2 peak_flops=1e11 jsonl="$tmp/new/dir/m.jsonl" > "$tmp/out"
grep -c '^step [246]/6 | loss ' "$tmp/out" | grep -qx 3 || { cat "$tmp/out"; fail "expected 3 progress lines"; }
grep -q $'[\r\033]' "$tmp/out" && fail "control characters in piped output"
grep -q '^step 6/6 .*| mfu .*% | mem [0-9]*MiB | took ' "$tmp/out" || { cat "$tmp/out"; fail "last line lacks mfu/mem/took"; }
grep -q '^step 2/6 .*| eta ' "$tmp/out" || fail "no eta"
[[ -s $tmp/new/dir/m.jsonl ]] || fail "metrics file not created with its parent dirs"
"$loom" run "$recipe" steps=3 every=1 jsonl="$tmp/nopeak.jsonl" > "$tmp/out2"
grep -q '^mfu n/a (no peak FLOP/s known' "$tmp/out2" || { cat "$tmp/out2"; fail "no n/a explanation"; }
grep '^step' "$tmp/out2" | grep -q 'mfu' && fail "cpu without peak_flops must show no mfu column"

# Peak table, unknown keys, and NaN/Inf written as null.
cat > "$tmp/unit.lua" <<'EOF'
local metrics = require "loom.metrics"
local function peak(d) return (metrics.peak_for(d)) end
assert(peak("cuda: NVIDIA H200 (sm_90)") == 989e12 and peak("NVIDIA H100 PCIe") == 756e12)
assert(peak("NVIDIA H100 80GB HBM3") == 989e12 and peak("NVIDIA A100-SXM4-80GB") == 312e12)
assert(peak("NVIDIA L40S") == 362e12 and peak("NVIDIA GeForce RTX 4090") == 165e12)
assert(peak("Tesla V100-SXM2-16GB") == 125e12)
for _, d in ipairs { "NVIDIA RTX A1000", "NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA L40",
    "Tesla V100-PCIE-16GB", "cpu: OpenBLAS 0.3.21 (openmp) threads=2" } do
  assert(peak(d) == nil, d)
end
local ok, err = pcall(metrics.new, { steps = 2, evry = 1 })
assert(not ok and err:find("unknown key 'metrics.evry'"), err)
local jsonl
for _, kv in ipairs(require("loom").overrides()) do if kv[1] == "jsonl" then jsonl = kv[2] end end
local m <close> = metrics.new { steps = 1, jsonl = jsonl }
m:step { step = 1, loss = 0 / 0, lr = 1e-3, grad_norm = 1 / 0, ms = 1, tokens = 8 }
EOF
"$loom" run "$tmp/unit.lua" jsonl="$tmp/nan.jsonl" > /dev/null || fail "peak table / key checks"

if command -v python3 > /dev/null; then
  python3 - "$tmp/new/dir/m.jsonl" "$tmp/nopeak.jsonl" "$tmp/nan.jsonl" <<'EOF'
import json, sys
def strict(c): raise ValueError("non-JSON constant " + c)
num = (int, float, type(None))  # a non-finite number is written as null
train = {"step": int, "loss": num, "lr": num, "grad_norm": num, "ms": num, "comm_ms": num, "tokens": num,
         "tokens_per_s": num, "mfu": num, "mem_bytes": int, "memory": (dict, type(None)), "time_s": num,
         "skipped": bool, "skipped_steps": int, "startup_peak_rss": (int, type(None))}
val = {"step": int, "val_loss": num, "time_s": num}
for path in sys.argv[1:]:
    rows = []
    for n, line in enumerate(open(path), 1):
        try:
            rows.append(json.loads(line, parse_constant=strict))
        except ValueError as e:
            sys.exit(f"{path}:{n}: {e}")
    assert rows[0]["kind"] == "run", rows[0]
    for r in rows[1:]:
        keys = {"train": train, "val": val}[r["kind"]]
        for k, t in keys.items():
            v = r.get(k, KeyError)
            ok = isinstance(v, bool) if t is bool else isinstance(v, t) and not isinstance(v, bool)
            assert ok, (path, k, r)
    kinds = [r["kind"] for r in rows]
    if path == sys.argv[1]:
        assert kinds.count("train") == 6 and kinds.count("val") == 2, kinds
        assert all(isinstance(r["mfu"], float) and r["mfu"] > 0 and isinstance(r["loss"], float)
                   for r in rows if r["kind"] == "train"), rows
    if path == sys.argv[2]:
        assert all(r["mfu"] is None for r in rows if r["kind"] == "train"), "mfu without a peak must be null"
    if path == sys.argv[3]:
        assert rows[1]["loss"] is None and rows[1]["grad_norm"] is None, rows[1]
print("jsonl schema ok:", ", ".join(sys.argv[1:]))
EOF
else
  echo "SKIP jsonl schema check: no python3"
fi

# On a terminal: the live line is redrawn in place and the last one is kept.
if script -qec true /dev/null > /dev/null 2>&1; then
  script -qec "'$loom' run '$recipe' steps=5 every=5" /dev/null > "$tmp/tty"
  grep -q $'\r\033\\[?7lstep 1/5 ' "$tmp/tty" || { cat -A "$tmp/tty"; fail "no in-place redraw on a tty"; }
  grep -q $'step 5/5 .*took [0-9]*s\033\\[K' "$tmp/tty" || { cat -A "$tmp/tty"; fail "last line not kept"; }
else
  echo "SKIP tty check: no usable 'script'"
fi

# loom plot: a well-formed SVG with its panels.
"$loom" plot "$tmp/new/dir/m.jsonl" -o "$tmp/plot.svg" > "$tmp/plot.out"
grep -qF "wrote $tmp/plot.svg (6 steps, 2 validation points)" "$tmp/plot.out" || fail "plot: $(cat "$tmp/plot.out")"
if command -v xmllint > /dev/null; then
  xmllint --noout "$tmp/plot.svg" || fail "plot is not well-formed XML"
else
  head -c 5 "$tmp/plot.svg" | grep -q '<svg ' && tail -n 1 "$tmp/plot.svg" | grep -qx '</svg>' ||
    fail "plot does not look like an SVG"
fi
for id in loss norm tokens lr; do grep -q "<g id=\"panel-$id\">" "$tmp/plot.svg" || fail "no $id panel"; done

# Refusals name the file (and the line).
refuse() { # expected-message args...
  local want=$1; shift
  if "$loom" plot "$@" > "$tmp/msg" 2>&1; then fail "plot $* should fail"; fi
  grep -qF -e "$want" "$tmp/msg" || { cat "$tmp/msg"; fail "plot $*: expected '$want'"; }
}
: > "$tmp/empty.jsonl"
printf '{"kind":"train","step":1,"loss":2}\ngarbage\n{"kind":"train","step":2,"loss":2}\n' > "$tmp/bad.jsonl"
refuse "$tmp/missing.jsonl: No such file" "$tmp/missing.jsonl"
refuse "$tmp/empty.jsonl: empty file" "$tmp/empty.jsonl"
refuse "$tmp/bad.jsonl:2: not a JSON object" "$tmp/bad.jsonl"
refuse "-o needs a file name" "$tmp/bad.jsonl" -o
echo "metrics: progress line, jsonl, peak table and plot ok"
