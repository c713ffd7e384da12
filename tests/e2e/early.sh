#!/usr/bin/env bash
# early.sh LOOM CRASH_PLUGIN_DIR — what used to be found late, or never named:
#  - ranks whose recipes differ: refused naming the keys that differ and both values;
#  - a rank that never arrives: comm_timeout=1 on the command line, or the recipe's own
#    comm_timeout = 1, bounds the start-up rendezvous (not the default 300 s), and the error
#    names the missing rank;
#  - loom launch -n 1000 (past the shm communicator's 256) and -n past 16 per core: refused
#    before any rank is forked;
#  - a plugin whose entry crashes, or that crashes in its op: named before the process dies.
set -uo pipefail
loom=$1 crash_dir=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"   # free_port
recipe=$here/recipes/losses.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export OMP_WAIT_POLICY=passive

# 1. different recipes, ranks started by hand (torchrun's variables)
port=$(free_port)
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$loom" run "$recipe" threads=1 mesh.dp=2 > "$tmp/d0" 2>&1 &
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$loom" run "$recipe" threads=1 mesh.dp=2 \
  steps=7 optimizer.lr=0.5 > "$tmp/d1" 2>&1
rc1=$?; wait $!; rc0=$?
[[ $rc0 -ne 0 && $rc1 -ne 0 ]] || fail "different recipes: exits $rc0, $rc1"
grep -qF "rank 1's recipe differs from rank 0's in: optimizer.lr 0.01 -> 0.5, steps 20 -> 7 (rank 0's value -> this rank's)" "$tmp/d1" ||
  fail "different recipes: keys not named: $(tail -n1 "$tmp/d1")"
grep -q '^LOSS' "$tmp/d0" "$tmp/d1" && fail "different recipes: trained"
echo "ok different recipes: $(grep -o "rank 1's recipe differs.*" "$tmp/d1")"

# 2. rank 1 never comes: rank 0 gives up after comm_timeout=1 (command line), naming it
port=$(free_port)
start=$(date +%s%N)
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$loom" run "$recipe" mesh.dp=2 comm_timeout=1 > "$tmp/alone" 2>&1 &&
  fail "rank 0 alone: exit 0"
ms=$(( ($(date +%s%N) - start) / 1000000 ))
grep -qF "rendezvous: rank 1 of 2 did not arrive at 127.0.0.1:$port within 1000 ms" "$tmp/alone" || fail "rank 0 alone: $(tail -n1 "$tmp/alone")"
(( ms < 10000 )) || fail "rank 0 alone waited ${ms} ms"
echo "ok missing rank: named after ${ms} ms (comm_timeout=1): $(tail -n1 "$tmp/alone")"
# ... and the recipe's own comm_timeout = 1 bounds it too (the rendezvous opens at the
# recipe's first collective, once the recipe is read)
port=$(free_port)
start=$(date +%s%N)
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$loom" run "$here/recipes/recipe_timeout.lua" mesh.dp=2 > "$tmp/alone2" 2>&1 &&
  fail "rank 0 alone (recipe timeout): exit 0"
ms=$(( ($(date +%s%N) - start) / 1000000 ))
grep -qF "rank 1 of 2 did not arrive at 127.0.0.1:$port within 1000 ms" "$tmp/alone2" || fail "rank 0 alone (recipe timeout): $(tail -n1 "$tmp/alone2")"
(( ms < 10000 )) || fail "rank 0 alone (recipe timeout) waited ${ms} ms"
echo "ok missing rank: named after ${ms} ms (the recipe's comm_timeout = 1): $(tail -n1 "$tmp/alone2")"

# 3. loom launch refuses absurd -n before forking anything
start=$(date +%s%N)
out=$("$loom" launch -n 1000 "$recipe" 2>&1); rc=$?
ms=$(( ($(date +%s%N) - start) / 1000000 ))
[[ $rc -eq 2 ]] || fail "-n 1000: exit $rc"
grep -qF "loom launch: -n must be between 1 and 256 (got 1000): the shm communicator joins at most 256 ranks of one machine" <<<"$out" || fail "-n 1000: $out"
grep -q "LOSS\|rank 0" <<<"$out" && fail "-n 1000: ranks started"
cores=$(nproc); many=$((16 * cores + 1))
if (( many <= 256 )); then
  out=$("$loom" launch -n $many "$recipe" 2>&1); rc=$?
  [[ $rc -eq 2 ]] || fail "-n $many: exit $rc"
  grep -qF "loom launch: -n $many is more than 16 ranks per core on this machine's $cores cores" <<<"$out" || fail "-n $many: $out"
fi
echo "ok launch -n 1000 refused in ${ms} ms before forking; -n $many on $cores cores refused too"

# 4. a plugin whose entry crashes is named
LOOM_PLUGIN_PATH=$crash_dir "$loom" run "$recipe" 'optimizer={"crash", lr=0.1}' > "$tmp/crash" 2>&1; rc=$?
[[ $rc -ne 0 ]] || fail "crashing plugin: exit 0"
grep -qF "loom: plugin '$crash_dir/loom-optim-crash.so' crashed while loading (in its constructors or loom_plugin_entry" "$tmp/crash" ||
  fail "crashing plugin not named (exit $rc): $(tail -n2 "$tmp/crash")"
echo "ok crashing plugin: exit $rc, $(grep -o "plugin '.*' crashed while loading" "$tmp/crash")"

# 5. a plugin that loads cleanly and crashes inside its op (the optimizer's step) is named,
# with the signal, and the exit still says the signal (128 + 11)
LOOM_PLUGIN_PATH=$crash_dir "$loom" run "$recipe" 'optimizer={"crashstep", lr=0.1}' > "$tmp/opcrash" 2>&1; rc=$?
[[ $rc -eq 139 ]] || fail "plugin crashing in its step: exit $rc, not 139: $(tail -n2 "$tmp/opcrash")"
grep -qF "loom: SIGSEGV inside plugin '$crash_dir/loom-optim-crashstep.so' (optim 'crashstep', at +0x" "$tmp/opcrash" ||
  fail "plugin crashing in its step not named: $(tail -n2 "$tmp/opcrash")"
grep -q "inside plugin" "$tmp/crash" && fail "the load crash was also blamed as an op crash: $(cat "$tmp/crash")"
echo "ok plugin crashing in its step: exit $rc, $(grep -o "SIGSEGV inside plugin '.*' (optim 'crashstep', at +0x[0-9a-f]*)" "$tmp/opcrash")"
