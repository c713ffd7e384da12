-- zero_export.lua — losses.lua's run (the same model, data, optimizer and schedule; LOSS
-- and NORM lines), then its weights written both ways a session writes them whole: an
-- llm.c file (core.llmc_save) and safetensors (session:export_safetensors), one pair a
-- rank under $EXPORT_OUT (PREFIX.rankR.bin and .st), for comparing a layout's files byte
-- for byte (zero.sh: the partitioned fp32 master under bf16 against LOOM_ZERO_MASTER=whole).
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local core = require "loom.core"
local common = require "common"
local out = assert(os.getenv("EXPORT_OUT"), "set EXPORT_OUT=PREFIX")
local session = loom.train(common.losses_run(common.model()))
local prefix = string.format("%s.rank%d", out, loom.rank or 0)
core.llmc_save(session, prefix .. ".bin")
print(string.format("EXPORT %d %d", loom.rank or 0,
  session:export_safetensors(prefix .. ".st", { format = "pt" })))
