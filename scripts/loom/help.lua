-- loom.help — `loom CMD --help` for every subcommand: what it does, its options, an
-- example. One table serves them all (the C commands run and launch ask for their text
-- here too), so a new command adds one entry and tests/e2e/cli_help.sh checks it.
local help = {}

local texts = {
  run = [[
usage: loom run RECIPE [key=value ...]

Run a Lua recipe as one rank (or as one rank of many, when started by loom launch,
torchrun, mpirun or srun). key=value arguments override the recipe's fields before they
are checked; dots nest, values parse as numbers, true/false, Lua tables or strings.

options:
  key=value        override a recipe field: steps=20, batch.micro=8, optimizer.lr=1e-3,
                   'optimizer={"sgd", lr=0.1}', checkpoint.dir=ckpt, resume=auto
  -h, --help       this text

environment:
  OMP_NUM_THREADS, OMP_WAIT_POLICY, GOMP_SPINCOUNT   OpenMP threads and waits (loom run
                   spins briefly, GOMP_SPINCOUNT=1000, unless one of the two wait settings
                   is set); the recipe's threads= wins
  LOOM_PLUGIN_PATH  extra plugin directories, searched first
  LOOM_CPU_ISA     force a lower CPU kernel ISA (avx512, avx2, sse2)
  LOOM_RENDEZVOUS_TIMEOUT_MS  how long the start-up rendezvous of a multi-rank run waits
                   for every rank (default: the recipe's comm_timeout, else 300000;
                   comm_timeout=S on the command line sets it too); the error names the
                   ranks that never came
  LOOM_LUA_MEMORY_MB, LOOM_LUA_INSTRUCTIONS  the recipe's Lua memory cap (default 4096) and
                   instruction budget between training steps (default 2e9); 0 lifts either

signals:
  SIGTERM, SIGINT or SIGUSR1 during loom.train's loop finish the step, save a checkpoint
  (with checkpoint.dir), say so and exit 128 + signo; a second signal stops at once
  LOOM_FLIGHT_DIR  where a rank writes its flight recorder dump (flight-rank<R>.txt) when a
                   communication fails (default: checkpoint.dir, else the current directory)
  LOOM_DEBUG_DESYNC=1  check every collective across ranks (as debug_desync=true)
  LOOM_INJECT_DIE=RANK:OP:N:MODE  testing aid: RANK dies at its N-th OP (allreduce, ...,
                   send, recv, barrier, any) by exit, kill, segv or stop (docs/RELIABILITY.md)

example:
  loom run scripts/recipes/tiny_shakespeare.lua steps=200 batch.micro=8]],

  launch = [[
usage: loom launch -n N RECIPE [key=value ...]

Fork N local ranks of `loom run RECIPE`, each with RANK, WORLD_SIZE, LOCAL_RANK and a
rendezvous on this machine. Rank 0's output is unprefixed, the others' lines start with
[rank k]. If a rank dies the others are stopped and launch exits non-zero naming it.
Unless set, each rank gets cores/N OpenMP threads with passive waits. SIGTERM, SIGINT
and SIGUSR1 are passed on to every rank, which stop together after the same step and save
(30 s grace, then SIGKILL; a second signal kills at once). At most 256 ranks (the shm
communicator's limit) and 16 per core (LOOM_LAUNCH_OVERSUBSCRIBE=1 lifts the latter).

options:
  -n N             number of ranks (required)
  key=value        recipe overrides, as for loom run
  -h, --help       this text

examples:
  loom launch -n 2 scripts/recipes/tiny_shakespeare.lua mesh.tp=2 tp_sequence_parallel=true
  loom launch -n 4 scripts/recipes/tiny_shakespeare.lua mesh.dp=4 strategy.zero=2   (docs/ZERO.md)
  loom launch -n 2 RECIPE mesh.dp=2 mesh.ep=2   (a loom.gpt{moe = {...}} model: docs/MOE.md)]],

  plugins = [[
usage: loom plugins [--keys NAME]

List every plugin found (kind, name, version, summary, path) in search order
(LOOM_PLUGIN_PATH, the install dir, the build tree), and every file refused with the
reason. With --keys, every key plugin NAME accepts in a recipe table, with its type,
default and help.

options:
  --keys NAME      the accepted keys of plugin NAME (or KIND/NAME, e.g. optim/adamw)
  -h, --help       this text

example:
  loom plugins --keys adamw]],

  plot = [[
usage: loom plot METRICS.jsonl [MORE.jsonl ...] [-o OUT.svg] [--smooth N] [--log]

Plots one or more runs' metrics files (what a recipe's log.jsonl names) as an SVG: loss
(train line, validation points), gradient norm, tokens/s and learning rate against step.
Each file gets its own colour, named in the legend; a dotted vertical line marks where a
run resumed. A half-written last line (a run that crashed) is skipped with a warning.

options:
  -o, --output OUT.svg  where to write (default: the first file with .svg for .jsonl)
  --smooth N            centred moving average over N logged steps of loss, grad norm
                        and tokens/s; the raw lines stay, faint (N >= 1; 1 = off)
  --log                 log-scale y for loss and grad norm
  -h, --help            this text

example:
  loom plot run/a/metrics.jsonl run/b/metrics.jsonl --smooth 20 --log -o compare.svg]],

  export = [[
usage: loom export --llmc CKPT OUT.bin

Write a checkpoint's weights as an llm.c model file (version 3, fp32), from any
tensor-parallel layout. CKPT is a checkpoint directory (step_*) or a checkpoint dir, from
which the newest complete checkpoint is taken.

options:
  --llmc           the llm.c model format (the only format today)
  -h, --help       this text

example:
  loom export --llmc ckpt model.bin]],

  bench = [[
usage: loom bench comm [-n N] [--op OP] [--sizes MIN:MAX] [--iters K] [--comm NAME]

Measure a communicator's bandwidth with N ranks of this program (loom launch; mpirun for
comm mpi), printed as nccl-tests prints it: size, count, time (slowest rank's mean),
algorithm and bus bandwidth, for sizes doubling from MIN to MAX.

options:
  -n N             ranks, at least 2 (default 2)
  --op OP          allreduce (default), reduce_scatter, allgather or broadcast
  --sizes MIN:MAX  byte sizes like 1K:64M or 4096 (default 1K:64M; 4 <= MIN <= MAX)
  --iters K        timed iterations per size (default 0: chosen by size)
  --comm NAME      communicator plugin (default shm; mpi runs under mpirun)
  -h, --help       this text

example:
  loom bench comm -n 4 --op allgather --sizes 1K:16M]],

  ["distill-cache"] = [[
usage: loom distill-cache RECIPE --out FILE [--k K] [key=value ...]

Run a training recipe's teacher (teacher = { checkpoint = DIR } or { model = loom.gpt{
init = FILE } }) forward once over the micro-batches its `steps` steps draw, and write each
token's K largest logits with their columns, a header and checksums (docs/DISTILL.md). A
run of the same data and batch shape with teacher = { cache = FILE, temperature, alpha }
then distils from the file without the teacher, at any dp. Runs on one rank.

options:
  --out FILE       the cache to write (FILE.tmp until complete)
  --k K            logits kept per token, 1..vocab (default min(64, vocab)); K = vocab
                   distils bitwise as the teacher itself does
  key=value        recipe overrides, as for loom run
  -h, --help       this text

example:
  loom distill-cache student.lua --out teacher.kdc --k 32
  loom run student.lua 'teacher={cache="teacher.kdc",alpha=0.9}']],

  plan = [[
usage: loom plan RECIPE [key=value ...] [--machine NAME|FILE] [--devices-per-node G] [--json]
       loom plan RECIPE --world N --devices-per-node G --mem 80GiB [--any-tp] [--any-pp] [--top K]
       loom plan --calibrate [--cpu-clock] [--out FILE] [-n RANKS] [--comm NAME] [--disk-dir DIR]
                         [--repeats N] [--from PROFILE]

Before a run, without allocating the model: each rank's bytes by category (parameters,
gradients, optimizer state, master weights, activations under the recipe's recompute and
pipeline schedule, communication buffers, workspace), the step time split into compute,
each collective per group and the pipeline bubble, tokens/s and MFU, and the assumptions
made. With --world, every layout (dp x tp x pp, zero, schedule, micro-batch, recompute,
offload) that fits, ranked by predicted tokens/s. After every run loom.train prints the
plan beside the measured peak RSS and step time ("plan vs run") and appends them to the
run directory's plan.jsonl. docs/PLAN.md explains the model and its limits.

options:
  key=value            recipe overrides, as for loom run
  --machine NAME|FILE  a bundled profile (cpu-2core, a100-node, h200-node) or a JSON file;
                       default: the calibrated one ($LOOM_MACHINE or ~/.cache/loom/machine.json),
                       else cpu-2core
  --devices-per-node G ranks per node (which link a group spans)
  --world N            search layouts of N ranks (needs --mem: one device's memory)
  --any-tp, --any-pp   lift the rules: tp inside a node; pipeline stages across nodes
  --top K              rows shown (default 10)
  --json               the plan as JSON
  --calibrate          measure this machine (GEMM, attention, element-wise, AdamW, memory
                       bandwidth, bf16's products and conversions; collectives over -n
                       RANKS of --comm (shm, or mpi through mpirun; nccl is not
                       calibrated); the runtime's own bytes; an offload file's reads and
                       writes; ZeRO-3's parameter reads; with --cpu-clock the device rates
                       again with every core running them at once)
  --disk-dir DIR       where --calibrate times the offload file (default $TMPDIR, else /tmp)
  --repeats N          calibrate N times and keep each figure's median (default 1)
  --from PROFILE       measure the collectives only (-n, --comm), the rest of the profile
                       PROFILE's (a calibrated one of this machine, e.g. for another --comm)
  --cpu-clock          calibrate with CPU time (a loaded machine: its waits left out)
  --out FILE           where --calibrate saves (default: the calibrated profile's path)
  -h, --help           this text

examples:
  loom plan scripts/recipes/tiny_shakespeare.lua mesh.dp=2 strategy.zero=1
  loom plan scripts/recipes/plan_gpt3_13b.lua --machine a100-node --world 16 --devices-per-node 8 --mem 80GB]],

  schedule = [[
usage: loom schedule NAME --pp P --micro M [--chunks V] [-o FILE.svg] [--costs FILE.json]

Build every stage's list of a pipeline schedule, validate it (each micro-batch forwarded
then backwarded once per chunk, every SEND received by the neighbour, no cycle of waits)
and simulate it with F = B = W = 1 (a fused backward 2) and transfers taking no time.
Prints one row per stage (F, B, W cells with the micro-batch, '.' idle), the simulated
bubble fraction beside the schedule's formula, and each stage's peak micro-batches in
flight (forwarded, not yet fully backwarded). Nothing is trained here: a recipe trains
with one through mesh = { pp = N }, schedule = NAME (a .lua file too; docs/PIPELINE.md).

NAME is a sched plugin (gpipe, 1f1b, interleaved, zb1; loom plugins lists them) or, when
it ends in .lua, a Lua file returning function(shape) -> list of {op = "FWD", mb = 0,
chunk = 0}, called once per stage with shape = {stages, stage, microbatches, chunks}
(docs/PIPELINE.md).

options:
  --pp P           pipeline stages (ranks), >= 1 (required)
  --micro M        micro-batches per step, >= 1 (required)
  --chunks V       virtual stages per rank (default 1; 2 for interleaved, which needs
                   M to be a multiple of P)
  -o, --output F   also write the timeline as an SVG
  --costs F        each instruction's own cost, from a JSON file {"each": [[...], ...]}
                   (one list per stage, one number per instruction of its list; a
                   transfer's is ignored): prints only the makespan and bubble
                   (scripts/pp_replay.py replays a traced run so)
  -h, --help       this text

example:
  loom schedule 1f1b --pp 4 --micro 8
  loom schedule interleaved --pp 4 --micro 8 --chunks 2 -o interleaved.svg]],

  sample = [[
usage: loom sample CKPT --prompt TEXT [options]

Generate text from a checkpoint with the key/value cache (loom.sample); progress and the
final rate go to stderr.

options:
  CKPT                   a checkpoint (step_*) or checkpoint directory (its newest one)
  --prompt TEXT          the text to continue
  --prompt-ids IDS       or token ids, comma-separated (e.g. 50256,15496)
  --tokens N             tokens to generate (default 200)
  --temperature T        softmax temperature, > 0 (default 1.0)
  --top-k K              sample among the K most likely tokens; 0: all (default 0)
  --seed S               sampling seed, >= 0 (default 0): the same seed, the same sample
  --tokenizer DIR        GPT-2 tokenizer (encoder.json, vocab.bpe) for a BPE model; default:
                         beside the shards the checkpoint was trained on
  --no-cache             recompute the whole window for every token (same tokens, slower)
  --shift                past the model's ctx, restart the window at the last ctx/2 tokens
                         (the cache keeps working) instead of sliding it by one per token
  -h, --help             this text

example:
  loom sample runs/shakespeare/ckpt --prompt "ROMEO:" --tokens 300 --temperature 0.8 --top-k 40]],

  ckpt = [[
usage: loom ckpt info CKPT
       loom ckpt export CKPT OUT.safetensors

Look into a checkpoint, from any tp x pp layout. CKPT is a checkpoint directory (step_*)
or a checkpoint dir, from which the newest complete checkpoint is taken.

subcommands:
  info             step, layout, optimizer and its state slots, precision, data position,
                   files with bytes and checksums, every tensor with its logical shape,
                   dtype and the file slices holding it; every checksum verified first
                   (exit 1 naming the damaged file)
  export           the model's weights as one safetensors file under their logical names
                   (tp slices and pp stages gathered, the tied wte once), F32
  -h, --help       this text (loom ckpt info -h, loom ckpt export -h: one subcommand's)

example:
  loom ckpt info ckpt
  loom ckpt export ckpt model.safetensors]],

  ["ckpt info"] = [[
usage: loom ckpt info CKPT

Verify every byte of a checkpoint (the manifest's own checksum; each tensor file's size,
xxh64, header checksum and tile checksums), then print what it holds: step,
layout (tp, pp, the blocks of each stage), model, optimizer and its state slots,
precision state, data position, the files with bytes and xxh64, and every model and
optimizer tensor with its logical shape, dtype and which file holds which slice. A
damaged checkpoint: exit 1, the message names the file and what is wrong.

options:
  -h, --help       this text

example:
  loom ckpt info runs/shakespeare/ckpt]],

  ["ckpt export"] = [[
usage: loom ckpt export CKPT OUT.safetensors

Write the model's weights of a checkpoint saved at any tp x pp layout as one safetensors
file (8-byte little-endian header length, JSON header with dtype, shape and data_offsets,
__metadata__ with format, loom.source, loom.step and loom.model): every parameter once
under its logical name and shape, F32, the tied wte once. The load that gathers them
checks the checksums of what it reads.

A loom.llama checkpoint is written in Hugging Face LlamaForCausalLM's names and layout
(model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ..., model.norm.weight,
lm_head.weight; the vocabulary without its padding rows), with a config.json beside
OUT.safetensors, so the directory loads with transformers' from_pretrained. With moe
(every block MoE, top_k >= 2) it is MixtralForCausalLM's: the router as
model.layers.N.block_sparse_moe.gate.weight, expert E's gate/up/proj as
block_sparse_moe.experts.E.w1/w3/w2.weight; moe.every > 1 or top_k = 1 is refused.

options:
  -h, --help       this text

example:
  loom ckpt export runs/shakespeare/ckpt model.safetensors]],

  version = [[
usage: loom version

Print loom's version.]],
}
help.texts = texts

-- The order `loom --help` lists commands in.
help.commands = { "run", "launch", "plugins", "plot", "export", "bench", "schedule", "sample", "ckpt", "version" }

-- Print the help of command `name` to stdout. Unknown names are an error.
function help.show(name)
  local text = texts[name]
  if not text then error("no help for '" .. tostring(name) .. "'", 0) end
  print(text)
end

-- Is args (a list of strings) asking for help?
function help.asked(args)
  for _, a in ipairs(args) do
    if a == "--help" or a == "-h" then return true end
  end
  return false
end

return help
