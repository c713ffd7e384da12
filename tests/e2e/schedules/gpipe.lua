-- gpipe.lua — GPipe written as a Lua schedule (docs/PIPELINE.md): the same lists as the
-- gpipe plugin, so `loom schedule` and core.sched_simulate must give the same timeline.
return function(shape)
  local list, s, last = {}, shape.stage, shape.stages - 1
  local function put(op, mb) list[#list + 1] = { op = op, mb = mb, chunk = 0 } end
  for mb = 0, shape.microbatches - 1 do
    if s > 0 then put("RECV_ACT", mb) end
    put("FWD", mb)
    if s < last then put("SEND_ACT", mb) end
  end
  for mb = 0, shape.microbatches - 1 do
    if s < last then put("RECV_GRAD", mb) end
    put("BWD", mb)
    if s > 0 then put("SEND_GRAD", mb) end
  end
  return list
end
