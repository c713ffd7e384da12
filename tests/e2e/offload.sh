#!/usr/bin/env bash
# offload.sh LOOM — strategy = { offload = { optimizer = "host" | "disk", path =, chunk_mb = } }
# (docs/ZERO.md "Offload"): the optimizer state in a host pool or a per-rank file, the
# step chunk by chunk.
#  - the same losses and norms, bitwise, with and without offload: host and disk (tiny
#    chunks, so segments are cut into pieces), one rank, dp=2 with zero = 0, 1, 2, 3, and
#    canonical mode at dp = 1 and 2 (zero 0, 1, 2, 3) and dp=2 x tp=2, and pp=2 x dp=2 zero=3;
#  - checkpoints: saved from and loaded into the pool or file, steps 4-6 after a save at 3
#    bitwise those without offload: disk -> disk, disk -> none, none -> host (one rank),
#    canonical dp=2 zero=2 disk -> host one rank, pp=2 x dp=2 zero=3 disk -> the same;
#  - bf16 with the fp32 master partitioned (zero=1 dp=2, disk, 4 steps): bitwise without
#    offload and with LOOM_ZERO_MASTER=whole; canonical mode bitwise one rank;
#  - the state file is removed at exit;
#  - disk on a model with ~55 MiB of AdamW state: the accounting moves the state off the
#    resident set (3 chunk buffers stay), and the measured VmRSS and VmHWM fall with it;
#  - params = true (zero=3's parameter partition offloaded too): host and disk bitwise
#    zero=3 without it at dp=2, canonical mode bitwise dp=1, pp=2 x dp=2, checkpoints
#    (params -> params, params -> none) bitwise; the partition's bytes off the resident set
#    (accounting, VmRSS, the training's VmHWM);
#  - errors: an unwritable path, no room for the file (ulimit -f), a file cut short while
#    training, params = true without zero=3 over dp >= 2, disk without path, an unknown
#    optimizer place.
set -euo pipefail
loom=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
recipe=$here/recipes/losses.lua
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_WAIT_POLICY=passive
mkdir -p "$tmp/state"
lines() { grep -E '^(LOSS|NORM) '; }
host="strategy.offload.optimizer=host strategy.offload.chunk_mb=0.01"
disk="strategy.offload.optimizer=disk strategy.offload.path=$tmp/state strategy.offload.chunk_mb=0.01"
run1() { "$loom" run "$recipe" threads=1 "$@" | lines; }
runN() { local n=$1; shift; "$loom" launch -n "$n" "$recipe" threads=1 mesh.dp="$n" comm_timeout=10 "$@" | lines; }
same() { # same BASE OTHER WHAT
  finite_losses "$1" "$2"
  cmp -s "$1" "$2" || { echo "FAIL $3: losses or norms differ from the run without offload"; paste "$1" "$2" | head -4; exit 1; }
  echo "ok $3: losses and norms bitwise those without offload ($(grep -c LOSS "$1") steps)"
}

# --- bitwise: fast mode -----------------------------------------------------------------
# (the one-rank runs without offload and with disk also save at step 3, $tmp/ck0 and
# $tmp/ck: the checkpoint checks below resume them; a save changes no bits)
run1 checkpoint.dir="$tmp/ck0" checkpoint.every=3 > "$tmp/base"
run1 $host > "$tmp/host"; same "$tmp/base" "$tmp/host" "host, one rank"
run1 $disk checkpoint.dir="$tmp/ck" checkpoint.every=3 > "$tmp/disk"; same "$tmp/base" "$tmp/disk" "disk, one rank"
for z in 1 3; do # zero = 0 and 2 with disk: canonical mode below, and the checkpoints
  runN 2 batch.micro=4 strategy.zero=$z > "$tmp/dp_z$z"
  runN 2 batch.micro=4 strategy.zero=$z $disk > "$tmp/dp_z${z}_disk"
  same "$tmp/dp_z$z" "$tmp/dp_z${z}_disk" "disk, dp=2 zero=$z"
done
runN 2 batch.micro=4 strategy.zero=1 $host > "$tmp/dp_z1_host"
same "$tmp/dp_z1" "$tmp/dp_z1_host" "host, dp=2 zero=1"
# bf16 with the fp32 master partitioned (zero_master.c: the master stays resident, the
# state goes to disk), 4 steps: bitwise without offload, and bitwise the whole master's
# (LOOM_ZERO_MASTER=whole) with disk; canonical mode: one rank's bits
bo="precision=bf16 steps=4 strategy.zero=1"
runN 2 batch.micro=4 $bo > "$tmp/bf"
runN 2 batch.micro=4 $bo $disk > "$tmp/bf_disk"; same "$tmp/bf" "$tmp/bf_disk" "disk, bf16 dp=2 zero=1 (the master partitioned)"
LOOM_ZERO_MASTER=whole runN 2 batch.micro=4 $bo $disk > "$tmp/bfw_disk"
finite_losses "$tmp/bfw_disk" "$tmp/bf_disk"
cmp -s "$tmp/bfw_disk" "$tmp/bf_disk" || { echo "FAIL disk, bf16 dp=2 zero=1: the partitioned master differs from the whole one (LOOM_ZERO_MASTER=whole)"; paste "$tmp/bfw_disk" "$tmp/bf_disk" | head -4; exit 1; }
echo "ok disk, bf16 dp=2 zero=1: the partitioned master bitwise the whole one (LOOM_ZERO_MASTER=whole)"
run1 deterministic=canonical batch.micro=2 batch.global=8 precision=bf16 steps=4 > "$tmp/bfc1"
runN 2 deterministic=canonical batch.micro=2 batch.global=8 $bo $disk > "$tmp/bfc2"
same "$tmp/bfc1" "$tmp/bfc2" "canonical disk, bf16 dp=2 zero=1 (the master partitioned) against one rank without offload"
leftover=$(ls "$tmp/state")
[ -z "$leftover" ] || { echo "FAIL: state files left after the runs: $leftover"; exit 1; }
echo "ok the state files are removed at exit"

# --- bitwise: canonical mode, one set of bits across layouts, offload on and off --------
canon="deterministic=canonical batch.micro=2 batch.global=8"
run1 $canon > "$tmp/c1"
run1 $canon $disk > "$tmp/c1_disk"; same "$tmp/c1" "$tmp/c1_disk" "canonical disk, dp=1"
rm -rf "$tmp/ckc"
for z in 0 1 2 3; do # zero=2's run also saves at step 3 (slice files), resumed below
  runN 2 $canon strategy.zero=$z $disk $([ $z = 2 ] && echo checkpoint.dir="$tmp/ckc" checkpoint.every=3) > "$tmp/c2_$z"
  same "$tmp/c1" "$tmp/c2_$z" "canonical disk dp=2 zero=$z against dp=1 without offload"
done
"$loom" launch -n 4 "$recipe" threads=1 mesh.dp=2 mesh.tp=2 comm_timeout=10 $canon strategy.zero=1 $host | lines > "$tmp/c_tp"
same "$tmp/c1" "$tmp/c_tp" "canonical host dp=2 x tp=2 zero=1 against dp=1 without offload"

# --- with pp: each stage's state (its zero partition) offloaded ------------------------
pp4() { "$loom" launch -n 4 "$recipe" threads=1 mesh.pp=2 mesh.dp=2 microbatches=2 comm_timeout=10 "$@" | lines; }
pp4 strategy.zero=3 > "$tmp/pp"
pp4 strategy.zero=3 $disk checkpoint.dir="$tmp/ckp" checkpoint.every=3 > "$tmp/pp_disk"; same "$tmp/pp" "$tmp/pp_disk" "disk, pp=2 x dp=2 zero=3"

# --- checkpoints: the offloaded state saved (read out of the pool or file) and loaded
# (written back into it); steps 4-6 after a save at 3, against the run without offload ---
ck="$tmp/ck/step_00000003"
resumed() { # resumed WANT GOT WHAT: steps 4-6 bitwise
  [ "$(grep -c '^LOSS' "$2")" -eq 3 ] || { echo "FAIL $3: expected steps 4-6"; cat "$2"; exit 1; }
  finite_losses "$2"
  cmp -s <(awk '$2 > 3 && $2 <= 6' "$1") "$2" || { echo "FAIL $3: resumed run differs"; paste <(awk '$2 > 3 && $2 <= 6' "$1") "$2" | head -4; exit 1; }
  echo "ok $3: steps 4-6 bitwise those without offload"
}
# (steps 4-6 of the 20-step runs serve: the lr schedule is fixed; the saves at step 3 were
# made by the runs above)
run1 steps=6 $disk resume="$ck" > "$tmp/r"; resumed "$tmp/base" "$tmp/r" "disk save -> disk resume, one rank"
run1 steps=6 resume="$ck" > "$tmp/r"; resumed "$tmp/base" "$tmp/r" "disk save -> resume without offload, one rank"
run1 steps=6 $host resume="$tmp/ck0/step_00000003" > "$tmp/r"; resumed "$tmp/base" "$tmp/r" "save without offload -> host resume, one rank"
run1 $canon steps=6 $host resume="$tmp/ckc/step_00000003" > "$tmp/r"
resumed "$tmp/c1" "$tmp/r" "canonical disk dp=2 zero=2 save (slice files) -> host one rank resume, against dp=1"
pp4 steps=6 strategy.zero=3 $disk resume="$tmp/ckp/step_00000003" > "$tmp/r"
resumed "$tmp/pp" "$tmp/r" "disk pp=2 x dp=2 zero=3 save -> the same resume"
[ -z "$(ls "$tmp/state")" ] || { echo "FAIL: state files left after the checkpoint runs"; exit 1; }

# --- params = true: zero=3's parameter partition in the pool or file too; each unit read
# out of it before its gather, the step on it there (docs/ZERO.md "Offloaded parameters")
par="strategy.offload.params=true"
runN 2 batch.micro=4 strategy.zero=3 $host $par > "$tmp/p_host"
same "$tmp/dp_z3" "$tmp/p_host" "host params + state, dp=2 zero=3"
rm -rf "$tmp/ck"; runN 2 batch.micro=4 strategy.zero=3 $disk $par checkpoint.dir="$tmp/ck" checkpoint.every=3 > "$tmp/p_disk"  # saved at 3 too
same "$tmp/dp_z3" "$tmp/p_disk" "disk params + state, dp=2 zero=3"
runN 2 $canon strategy.zero=3 $disk $par > "$tmp/p_c2"
same "$tmp/c1" "$tmp/p_c2" "canonical disk params dp=2 zero=3 against dp=1 without offload"
pp4 strategy.zero=3 $disk $par > "$tmp/p_pp"; same "$tmp/pp" "$tmp/p_pp" "disk params, pp=2 x dp=2 zero=3"
runN 2 steps=6 batch.micro=4 strategy.zero=3 $disk $par resume="$ck" > "$tmp/r"
resumed "$tmp/dp_z3" "$tmp/r" "disk params dp=2 zero=3 save -> the same resume"
runN 2 steps=6 batch.micro=4 strategy.zero=3 resume="$ck" > "$tmp/r"
resumed "$tmp/dp_z3" "$tmp/r" "disk params dp=2 zero=3 save -> zero=3 resume without offload"
[ -z "$(ls "$tmp/state")" ] || { echo "FAIL: state files left after the params runs"; exit 1; }

# The resident set with the parameters offloaded: dp=2 zero=3 on the 7.2 M-parameter model
# (14.4 MB of parameter partition a rank), the state on disk in both runs. The peak is the
# training's: the recipe resets VmHWM after step 1 (the start-up peak, when the model's
# full-size buffers are written on every rank, is the same with and without offload).
prss() { MALLOC_PERTURB_=165 RSS_TRAINING_PEAK=1 "$loom" launch -n 2 \
  "$here/recipes/offload_rss.lua" mesh.dp=2 strategy.zero=3 strategy.offload.optimizer=disk \
  strategy.offload.path="$tmp/state" strategy.offload.chunk_mb=1 "$@" | grep '^PARAMS '; }
read -r par0 poff0 phwm0 prss0 < <(prss | cut -d' ' -f2-)
read -r par1 poff1 phwm1 prss1 < <(prss $par | cut -d' ' -f2-)
echo "   zero=3 disk state:          params $par0 B resident, training peak RSS $phwm0 B, RSS $prss0 B"
echo "   zero=3 disk state + params: params $par1 B resident + $poff1 B on disk, training peak RSS $phwm1 B, RSS $prss1 B"
[ "$poff0" -eq 0 ] && [ "$par1" -eq 0 ] && [ "$poff1" -eq "$par0" ] && [ "$par0" -gt 10000000 ] ||
  { echo "FAIL accounting: the parameter partition ($par0 B) should be offloaded, none resident"; exit 1; }
[ $((prss0 - prss1)) -ge $((poff1 * 9 / 10)) ] ||
  { echo "FAIL measured RSS fell by $((prss0 - prss1)) B, less than 90% of the $poff1 B of parameters offloaded"; exit 1; }
[ $((phwm0 - phwm1)) -ge $((poff1 / 2)) ] ||
  { echo "FAIL measured training peak RSS fell by $((phwm0 - phwm1)) B, less than half the $poff1 B of parameters offloaded"; exit 1; }
echo "ok disk params: $poff1 B off the resident set; RSS fell by $((prss0 - prss1)) B, training peak RSS by $((phwm0 - phwm1)) B"

# --- the resident set: ~55 MiB of AdamW state on disk ----------------------------------
# With MALLOC_PERTURB_ set whatever runs this (meson sets it too): it makes free() write
# the pages it frees, so state allocated and freed at start-up would show up resident;
# neither the session nor ZeRO allocates the state when it is offloaded.
rss() { MALLOC_PERTURB_=165 "$loom" run "$here/recipes/offload_rss.lua" "$@" | grep '^RSS '; }
read -r opt0 off0 hwm0 rss0 < <(rss | cut -d' ' -f2-)
read -r opt1 off1 hwm1 rss1 < <(rss strategy.offload.optimizer=disk strategy.offload.path="$tmp/state" strategy.offload.chunk_mb=1 | cut -d' ' -f2-)
echo "   without offload: optimizer $opt0 B resident, peak RSS $hwm0 B, RSS $rss0 B"
echo "   disk:            optimizer $opt1 B resident + $off1 B on disk, peak RSS $hwm1 B, RSS $rss1 B"
[ "$off0" -eq 0 ] && [ "$off1" -eq "$opt0" ] && [ "$opt1" -le $((3 * 1048576)) ] ||
  { echo "FAIL accounting: the state ($opt0 B) should be offloaded with at most 3 MiB of chunk buffers resident"; exit 1; }
want=$(( (opt0 - opt1) * 9 / 10 ))
[ $((rss0 - rss1)) -ge "$want" ] ||
  { echo "FAIL measured RSS fell by $((rss0 - rss1)) B, less than 90% of the $((opt0 - opt1)) B moved to disk"; exit 1; }
[ $((hwm0 - hwm1)) -ge $(( (opt0 - opt1) / 3 )) ] ||
  { echo "FAIL measured peak RSS fell by $((hwm0 - hwm1)) B, less than a third of the $((opt0 - opt1)) B moved to disk"; exit 1; }
echo "ok disk: $off1 B of state off the resident set; RSS fell by $((rss0 - rss1)) B, peak RSS by $((hwm0 - hwm1)) B"

# --- errors -----------------------------------------------------------------------------
refuse() { # refuse PATTERN WHAT ARGS...: the run must fail with a message matching PATTERN
  local pat=$1 what=$2; shift 2
  if "$@" > "$tmp/out" 2>&1; then echo "FAIL $what: the run succeeded"; exit 1; fi
  grep -q -- "$pat" "$tmp/out" || { echo "FAIL $what: no message matching '$pat'"; tail -3 "$tmp/out"; exit 1; }
  grep -q "Segmentation\|core dumped" "$tmp/out" && { echo "FAIL $what: crashed"; exit 1; }
  echo "ok refused, $what: $(grep -m1 -- "$pat" "$tmp/out" | cut -c1-150)"
}
refuse "cannot create" "unwritable path" "$loom" run "$recipe" threads=1 steps=1 \
  strategy.offload.optimizer=disk strategy.offload.path=/nonexistent/dir
refuse "needs [0-9]* bytes" "no room for the file" bash -c "trap '' XFSZ; ulimit -f 1; exec \"\$@\"" _ \
  "$loom" run "$here/recipes/offload_rss.lua" strategy.offload.optimizer=disk strategy.offload.path="$tmp/state"
[ -z "$(ls "$tmp/state")" ] || { echo "FAIL: the file that could not be reserved was left"; exit 1; }
refuse "short read" "file cut short while training" env OFFLOAD_DIR="$tmp/state" "$loom" run "$here/recipes/offload_truncate.lua"
refuse "needs strategy.zero = 3 over 2 or more dp ranks" "params = true on one rank" "$loom" run \
  "$recipe" threads=1 steps=1 strategy.offload.optimizer=host strategy.offload.params=true
refuse "needs strategy.zero = 3 over 2 or more dp ranks" "params = true with zero=1" "$loom" launch \
  -n 2 "$recipe" threads=1 steps=1 mesh.dp=2 strategy.zero=1 strategy.offload.optimizer=host \
  strategy.offload.params=true
refuse "needs path" "disk without path" "$loom" run "$recipe" threads=1 steps=1 strategy.offload.optimizer=disk
refuse "host, disk" "an unknown place" "$loom" run "$recipe" threads=1 steps=1 strategy.offload.optimizer=nvme
echo "offload: all checks passed"
