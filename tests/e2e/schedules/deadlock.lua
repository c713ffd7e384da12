-- deadlock.lua — wrong on purpose, for 2 stages and 2 micro-batches: every instruction is
-- matched, but stage 0 waits for micro-batch 0's gradient before it sends micro-batch 1's
-- activations, while stage 1 wants micro-batch 1 first. Refused by the simulator:
-- "deadlock: stage 0 waits at instruction 2 (RECV_GRAD mb 0 chunk 0) and stage 1 at
-- instruction 0 (RECV_ACT mb 1 chunk 0)".
return function(shape)
  assert(shape.stages == 2 and shape.microbatches == 2, "deadlock.lua is for --pp 2 --micro 2")
  local function I(op, mb) return { op = op, mb = mb } end
  if shape.stage == 0 then
    return { I("FWD", 0), I("SEND_ACT", 0), I("RECV_GRAD", 0), I("BWD", 0),
             I("FWD", 1), I("SEND_ACT", 1), I("RECV_GRAD", 1), I("BWD", 1) }
  end
  return { I("RECV_ACT", 1), I("FWD", 1), I("BWD", 1), I("SEND_GRAD", 1),
           I("RECV_ACT", 0), I("FWD", 0), I("BWD", 0), I("SEND_GRAD", 0) }
end
