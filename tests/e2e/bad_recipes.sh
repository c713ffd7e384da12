#!/usr/bin/env bash
# bad_recipes.sh LOOM — a table of invalid recipes: each is one line of Lua changing a valid
# recipe's table t (line 3 of the recipe below), and the fragment its refusal must contain.
# Every one must be refused with exit != 0, naming the recipe's file:line, before the session
# is built (no "memory/rank" line: nothing allocated) and before any step. Then the Lua
# limits: an endless loop and a memory bomb, at top level and in on_step, get a named error;
# a precompiled (binary) chunk is refused as a recipe and through load/loadfile/require.
set -uo pipefail
loom=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
data=$(cd "$here/../.." && pwd)/data/tinyshakespeare.txt
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
n=0 fails=0

check() { # where fragment output rc [late: on_step's own errors come after steps]
  local where=$1 frag=$2 out=$3 rc=$4
  n=$((n + 1))
  if [[ $rc -eq 0 ]]; then echo "FAIL $where: accepted (exit 0)"; fails=$((fails + 1)); return; fi
  if [[ -z ${5:-} ]] && grep -q '^memory/rank\|^step [0-9]' <<<"$out"; then
    echo "FAIL $where: refused only after the session was built or a step ran"; fails=$((fails + 1)); return
  fi
  if ! grep -qF -- "$frag" <<<"$out"; then
    echo "FAIL $where: expected '$frag'"; echo "  got: $(tail -2 <<<"$out")"; fails=$((fails + 1)); return
  fi
  echo "ok   $(grep -F -- "$frag" <<<"$out" | head -1 | sed 's/^loom: //' | cut -c1-200)"
}

# Each case in a directory of its own as r.lua, two at a time (the machine's two cores),
# then checked in table order.
k=0
while IFS='|' read -r change frag; do
  [[ -z $change || $change == '#'* ]] && continue
  k=$((k + 1)); mkdir "c$k"
  printf '%s\n' "$change" > "c$k/change"; printf '%s\n' "$frag" > "c$k/frag"
  cat > "c$k/r.lua" <<EOR
local loom = require "loom"
local t = { model = loom.gpt { vocab = 256, ctx = 32, layers = 2, heads = 2, dim = 32 }, data = loom.data.text { path = "$data" }, optimizer = { "adamw", lr = 1e-3 }, batch = { micro = 2, seq = 16 }, steps = 2, threads = 1 }
$change
loom.train(t)
EOR
  (cd "c$k" && { timeout 60 "$loom" run r.lua > out 2>&1; echo $? > rc; }) &
  (( k % 2 == 0 )) && wait
done <<'EOF_CASES'
t.steps = -1|steps=-1 must be >= 0
t.steps = 1.5|steps must be integer, got number 1.5
t.steps = nil|the recipe needs key 'steps'
t.model = nil|the recipe needs key 'model' (loom.gpt{...})
t.model = loom.gpt { vocab = 256, ctx = 32, layers = 2, heads = 3, dim = 32 }|loom.gpt heads=3 does not divide dim=32 (heads may be 1, 2, 4, 8, 16, 32)
t.model = loom.gpt { vocab = 1, ctx = 32, layers = 2, heads = 2, dim = 32 }|loom.gpt.vocab=1 must be >= 2
t.model = loom.gpt { vocab = 256, ctx = 0, layers = 2, heads = 2, dim = 32 }|loom.gpt.ctx=0 must be >= 1
t.model = loom.gpt { vocab = 256, ctx = 32, layers = 0, heads = 2, dim = 32 }|loom.gpt.layers=0 must be >= 1
t.model = loom.gpt { vocab = 256, ctx = 32, layers = 2, heads = 2, dim = 32, dropout = 0.1 }|unknown key 'loom.gpt.dropout' (accepted: ctx, dim, heads, init, layers, moe, vocab, vocab_padded)
t.model = loom.gpt { vocab = 300, ctx = 32, layers = 2, heads = 2, dim = 32 }|loom.data.text gives byte tokens: the model needs vocab=256, got 300
t.model = { kind = "llama" }|model must come from loom.gpt{...}
t.model.family = "llama"|on a model made by loom.gpt{...}: a Llama model comes from loom.llama{
t.model.family = "mamba"|is not a family ("gpt" from loom.gpt{...} or "llama" from loom.llama{...})
t.data = loom.data.text { path = "/nonexistent/x.txt" }|data file '/nonexistent/x.txt' not found
t.data = loom.data.text { path = "x", val_fraction = 1.5 }|loom.data.text.val_fraction=1.5 must be <= 0.99
t.data = loom.data.text { path = "x", shuffle = "yes" }|loom.data.text.shuffle must be boolean, got string yes
t.data = loom.data.shards { train = "/nonexistent/train_*.bin" }|train shard glob '/nonexistent/train_*.bin'
t.data = { kind = "csv" }|data must come from loom.data.text{...}, loom.data.shards{...} or loom.data.random{...}
t.data = loom.data.random { vocab = 100 }|loom.data.random vocab=100 differs from the model's vocab=256
t.eval = { every = 1 }; t.data = loom.data.text { path = t.data.path, val_fraction = 0.00001 }|the val split holds 11 tokens, and one batch of batch.micro x batch.seq = 2 x 16 needs 33 (raise data.val_fraction
t.eval = { batches = 2 }|eval needs key 'every'
t.optimizer = "adamx"|no optim plugin 'adamx'
t.optimizer = { lr = 1e-3 }|optimizer table needs the plugin's name first, e.g. { "adamw", lr = 3e-4 }
t.optimizer = { "adamw", lr = -1 }|adamw: lr must be a finite number > 0, got -1
t.optimizer = { "adamw", lr = 1e-3, betas = { 0.9 } }|adamw: betas must be two numbers {b1, b2}
t.optimizer = { "adamw", lr = 1e-3, momentum = 0.9 }|optim 'adamw' has no key 'momentum' (accepted: lr, betas, eps, weight_decay, decay, freeze_variance)
t.optimizer = 42|optimizer must be string or table, got number 42
t.lr = -1|lr=-1 must be > 0
t.lr = 0/0|lr is nan (not a number): give a finite value
t.lr = math.huge|adamw: lr must be a finite number > 0, got inf
t.lr = loom.lr.cosine { warmup = 5 }|loom.lr.cosine needs total (the last step of decay)
t.lr = loom.lr.cosine { warmup = 50, total = 10 }|lr.warmup=50 is past lr.total=10
t.lr = { kind = "step" }|lr.kind=step is not a schedule (accepted: constant, cosine
t.batch = { micro = 0, seq = 16 }|batch.micro=0 must be >= 1
t.batch = { micro = 2, seq = 64 }|batch.seq=64 is longer than the model's ctx=32
t.batch = { micro = 2, seq = 16, global = 3 }|batch.global=3 is not a multiple of micro x dp = 2 (try 2 or 4)
t.batch = { micro = 2 }|batch needs key 'seq'
t.batch = { micro = 2, seq = 16, accum = 2 }|unknown key 'batch.accum' (accepted: global, micro, seq)
t.mesh = { dp = 2 }|mesh dp=2 x tp=1 x pp=1 = 2 ranks, but this run has 1 (start it with loom launch -n 2
t.mesh = { dp = 0 }|mesh.dp=0 must be >= 1
t.mesh = { tp = 3 }|mesh tp=3 does not divide heads=2 (tp may be 1, 2)
t.grad_clip = -1|grad_clip=-1 must be >= 0
t.on_nonfinite = "ignore"|on_nonfinite=ignore is not one of: skip, stop, rollback
t.on_spike = "panic"|on_spike=panic is not one of: warn, skip, rollback, stop
t.spike = { window = 1 }|spike.window=1 must be >= 2
t.spike = { window = 10 }|spike = {...} tunes the loss-spike detector, and on_spike is not set
t.on_spike = "rollback"|on_spike="rollback" reloads the last good checkpoint, and this run saves none
t.max_skipped = -1|max_skipped=-1 must be >= 0
t.checkpoint = { every = 5 }|checkpoint needs key 'dir'
t.checkpoint = { dir = "/proc/nope/ckpt", every = 1 }|checkpoint.dir="/proc/nope/ckpt": cannot create directory '/proc/nope'
t.checkpoint = { dir = "/proc/version/ckpt" }|checkpoint.dir="/proc/version/ckpt": cannot create directory '/proc/version': Not a directory
t.resume = "auto"|resume="auto" needs checkpoint = { dir = ... } to look in
t.resume = "/nonexistent/step_00000005"|cannot resume: resume="/nonexistent/step_00000005" is not a checkpoint (/nonexistent/step_00000005/manifest.json: No such file or directory
t.sample = { every = 1, temperature = 0 }|sample.temperature must be positive, got number 0
t.log = { jsonl = "/proc/nope/m.jsonl" }|metrics file '/proc/nope/m.jsonl': cannot create directory '/proc/nope'
t.log = { trace = "" }|log.trace is empty: give the directory the per-rank traces go to
t.deterministic = "exact"|deterministic=exact is not one of: fast, canonical
t.recompute = "partial"|recompute="partial" is not a mode: use "none", "full", "selective"
t.recompute = { 5 }|recompute[1]=5 is not a block index: the model's blocks are 0..1
t.schedule = "1f1b"|schedule=1f1b sets up the pipeline, and this run has no pipeline (mesh.pp = 1)
t.pp_layers = { 1, 1 }|pp_layers={...} sets up the pipeline, and this run has no pipeline
t.strategy = { zero = 5 }|strategy.zero=5 must be 0, 1, 2 or 3 (the ZeRO stage)
t.strategy = { fsdp = true }|strategy.fsdp is not available in this build
t.host_comm = "tcp"|host_comm=tcp: no comm plugin 'tcp'
t.device_wait = true|device_wait=true goes beside a communicator that takes device memory (comm = "nccl": the backend's stream waits on each collective); comm = "shm" carries host memory
t.comm = "tcp"|comm=tcp: no comm plugin 'tcp'
t.comm_timeout = 0|comm_timeout must be positive, got number 0
t.precision = "fp8"|no precision plugin 'fp8'
t.threads = -2|threads=-2 must be >= 0
t.seed = -1|seed=-1 must be >= 0
t.on_step = "print"|on_step must be function, got string print
t.peak_flops = -5|peak_flops must be positive, got number -5
t.stepz = 3|unknown key 'stepz' (accepted: backend, batch,
EOF_CASES
wait
for ((i = 1; i <= k; i++)); do
  change=$(cat "c$i/change") frag=$(cat "c$i/frag") out=$(cat "c$i/out") rc=$(cat "c$i/rc")
  # the file:line: loom.* constructors on the change's line 3, loom.train's checks on line 4
  grep -qE '^loom: r\.lua:[34]: ' <<<"$out" || { n=$((n + 1)); echo "FAIL '$change': no r.lua:LINE: in: $(tail -1 <<<"$out")"; fails=$((fails + 1)); continue; }
  check "'$change'" "$frag" "$out" "$rc"
done

# Lua limits (core/lua/lua_limits.h), with small limits so that each is met in a second
limits() { # name env fragment recipe-text [late]
  local name=$1 env=$2 frag=$3
  printf '%s\n' "$4" > "$name.lua"
  out=$(env $env timeout 60 "$loom" run "$name.lua" 2>&1); rc=$?
  check "$name" "$frag" "$out" "$rc" "${5:-}"
}
recipe_on_step() { # the valid recipe, with on_step's body
  printf 'local loom = require "loom"\nloom.train { model = loom.gpt { vocab = 256, ctx = 32, layers = 2, heads = 2, dim = 32 }, data = loom.data.text { path = "%s" }, optimizer = { "adamw", lr = 1e-3 }, batch = { micro = 2, seq = 16 }, steps = 3, threads = 1,\n  on_step = function(r)\n    %s\n  end }\n' "$data" "$1"
}
limits loop LOOM_LUA_INSTRUCTIONS=5e6 "loop.lua:2: the recipe's Lua code ran 5e+06 instructions without a training step (an endless loop?); LOOM_LUA_INSTRUCTIONS=N raises the limit" \
  $'local n = 0\nwhile true do n = n + 1 end'
limits step_loop LOOM_LUA_INSTRUCTIONS=5e6 "step_loop.lua:4: the recipe's Lua code ran 5e+06 instructions without a training step" \
  "$(recipe_on_step 'if r.step == 2 then local n = 0; while true do n = n + 1 end end')" late
limits bomb LOOM_LUA_MEMORY_MB=16 "the recipe's Lua code needs more than 16 MiB of memory (a table that grows without bound?); LOOM_LUA_MEMORY_MB=N raises the cap" \
  $'local t = {}\nfor i = 1, 1e9 do t[i] = string.rep("x", 1000) .. i end'
limits step_bomb LOOM_LUA_MEMORY_MB=16 "the recipe's Lua code needs more than 16 MiB of memory" \
  "$(recipe_on_step 'local t = {}; for i = 1, 1e9 do t[i] = string.rep("y", 1000) .. i end')" late
# a binary chunk as the recipe, and through load, loadfile and require inside one
"$loom" run /dev/stdin <<<'local f = io.open("bin.luac", "wb"); f:write(string.dump(function() print("hi") end)); f:close()' ||
  { echo "FAIL: could not write bin.luac"; fails=$((fails + 1)); }
out=$("$loom" run bin.luac 2>&1); rc=$?
check "binary recipe" "recipe 'bin.luac' is a precompiled (binary) Lua chunk: loom runs recipes from source only" "$out" "$rc"
limits inner_binary "" "bin.luac' is a precompiled (binary) Lua chunk: loom runs Lua from source only" $'package.path = "./?.luac;" .. package.path\nassert(load(string.dump(function() end)) == nil)\nassert(loadfile("bin.luac") == nil)\nrequire "bin"'
echo "$((n - fails)) of $n refused as expected, $fails failed"
[[ $fails -eq 0 ]]
