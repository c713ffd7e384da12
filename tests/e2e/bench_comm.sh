#!/usr/bin/env bash
# bench_comm.sh LOOM — `loom bench comm` prints nccl-tests' table for the sizes asked
# (shm through loom launch; mpi through mpirun where Open MPI and the plugin exist), and
# refuses a bad size.
set -euo pipefail
loom=$1
check() { # comm
  out=$("$loom" bench comm -n 2 --comm "$1" --sizes 4K:16K)
  rows=$(awk '$1 ~ /^[0-9]+$/ && NF == 5' <<<"$out" | wc -l)
  [[ $rows -eq 3 ]] || { echo "$1: expected rows for 4K, 8K, 16K:"; echo "$out"; exit 1; }
  grep -q "busbw" <<<"$out" || { echo "$1: no busbw column"; exit 1; }
  echo "ok loom bench comm --comm $1: $(awk '$1 == 16384 { print "16 KiB busbw " $5 " GB/s" }' <<<"$out")"
}
check shm
if command -v mpirun >/dev/null && "$loom" plugins | grep -q '^comm  *mpi '; then check mpi; fi
if out=$("$loom" bench comm -n 2 --sizes 4Q 2>&1); then echo "bad size accepted"; exit 1; fi
grep -q "is not a size like 1K, 64M or 4096" <<<"$out" || { echo "unexpected: $out"; exit 1; }
echo "ok bad size refused"
