-- bench_zero_layouts.lua — bench_gpt.lua's throughput run (the same timing, JSON line and
-- command-line shapes) with its memory line: this rank's bytes by category from loom's
-- accounting and the measured peak resident set of the warm-up (model construction
-- included) and of the timed steps, for scripts/bench-zero-layouts.
BENCH_MEMORY = true
dofile(arg[0]:match("^(.*)/[^/]*$") .. "/bench_gpt.lua")
