-- plan_expect.lua — what loom plan predicts for plan_probe.lua under the same key=value
-- overrides, one line per pipeline stage, for tests/e2e/plan.sh to hold the runs against:
--   PLAN stage params grads optimizer activations peak_rss busy_ms (the stage's own work)
--        page_faults (per step: ZeRO 2/3's pages handed back and touched again) master
--        (bf16 / fp16: the fp32 parameters beside the 16-bit compute copy; else 0)
--   PARAMS n (what the plan's MFU counts as the model's parameters: the run's own count,
--        loom_gpt_num_params, is in a one-rank run's log.jsonl)
-- (the machine: $LOOM_MACHINE, the profile the test calibrated).
local here = arg[0]:match("^(.*)/[^/]*$")
local cli = require "loom.plan_cli"
local t = cli.capture(here .. "/plan_probe.lua", require("loom").overrides())
local p = cli.api(t)
for k, m in ipairs(p.memory) do
  print(string.format("PLAN %d %d %d %d %d %.0f %.3f %d %d", k - 1, m.params, m.grads, m.optimizer,
    m.activations, p.rss_stage[k], p.time.stage_busy_s[k] * 1e3, p.time.page_faults[k], m.master))
end
print(string.format("PARAMS %d", (p.flops_per_token - 6 * t.model.layers * t.model.dim * t.batch.seq) // 6))
