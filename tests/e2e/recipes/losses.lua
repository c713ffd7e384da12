-- losses.lua — train the small model and print every step's loss as a hex float, so a
-- test can compare runs bit for bit, and the gradient norm (NORM lines). Batch shape and optimizer come from key=value.
package.path = arg[0]:match("^(.*)/[^/]*$") .. "/?.lua;" .. package.path
local loom = require "loom"
local common = require "common"
loom.train(common.losses_run(common.model()))
