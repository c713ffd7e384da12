#!/usr/bin/env bash
# bench_llmc_args.sh BENCH_LLMC — scripts/bench_llmc (bench-cpu --llmc DIR) refuses, with a
# message naming what is wrong, a DIR that is not a built llm.c checkout, a train_gpt2.c it
# cannot patch, a batch that does not fit in memory and too few steps. (The comparison itself
# needs the user's llm.c checkout, which is not in this repository; docs/BENCHMARKS.md has
# its figures.)
set -euo pipefail
bench=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
refused() {  # EXPECTED-TEXT ARGS...: the run must fail with exit status 2 and print the text
  local want=$1 out rc=0; shift
  out=$("$bench" "$@" 2>&1) || rc=$?
  [[ $rc -eq 2 ]] || { echo "bench_llmc $*: exit $rc, expected 2: $out"; exit 1; }
  grep -qF -- "$want" <<<"$out" || { echo "bench_llmc $*: expected '$want' in: $out"; exit 1; }
  echo "ok refused ($*): $out"
}
refused "is not a directory" "$tmp/nowhere" 1 2 1 3
refused "has no built train_gpt2; run 'make train_gpt2'" "$tmp" 1 2 1 3
# A checkout with a binary and the lines the bench patches, as llm.c master's train_gpt2.c
# has them; then one of them changed (T=128), and train_gpt2.c gone.
mkdir -p "$tmp/llmc/llmc"; : > "$tmp/llmc/llmc/dataloader.h"
printf '#!/bin/sh\n' > "$tmp/llmc/train_gpt2"; chmod +x "$tmp/llmc/train_gpt2"
lines='int B = 4;\nint T = 64;\nfor (int step = 0; step <= 40; step++) {\nif (step %% 10 == 0) {\nif (step > 0 && step %% 20 == 0) {\n'
printf "$lines" > "$tmp/llmc/train_gpt2.c"
refused "needs about" "$tmp/llmc" 1 2 4096 3
refused "--llmc-steps must be >= 2" "$tmp/llmc" 1 2 1 1
refused "--llmc-batch must be a positive integer" "$tmp/llmc" 1 2 0 3
printf "${lines/64/128}" > "$tmp/llmc/train_gpt2.c"
refused "has 'int T = 64;' 0 times (expected once)" "$tmp/llmc" 1 2 1 3
rm "$tmp/llmc/train_gpt2.c"
refused "lacks train_gpt2.c" "$tmp/llmc" 1 2 1 3
