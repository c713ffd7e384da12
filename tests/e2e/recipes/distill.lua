-- distill.lua — train a small model on the test text and print every step's loss (LOSS
-- lines, hex and decimal) and the validation loss at the end (VAL); the model, teacher
-- and steps come from key=value or TEACHER_BIN (tests/e2e/distill.sh).
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
-- TEACHER_BIN: distil from an llm.c file (loom.gpt{init}) instead of a key=value teacher
local bin = os.getenv("TEACHER_BIN")
loom.train {
  teacher = bin and { model = loom.gpt { init = bin }, temperature = 1, alpha = 0.9 } or nil,
  model = loom.gpt { vocab = 256, ctx = 32, layers = 1, heads = 2, dim = 32 },
  data = common.data(),
  optimizer = { "adamw", lr = 3e-3, weight_decay = 0.0 },
  batch = { micro = 8, seq = 32 }, steps = 100, seed = 5, threads = 1,
  eval = { every = 100000, batches = 16 },
  log = { every = 100000 },
  on_step = function(r)
    print(string.format("LOSS %d %a %.9f", r.step, r.loss, r.loss))
    if r.val_loss then print(string.format("VAL %d %.6f", r.step, r.val_loss)) end
  end,
}
