-- gpipe_reversed.lua — GPipe with the backwards in reverse micro-batch order (m-1 first):
-- valid, so it trains in fast mode, but canonical mode needs each chunk's micro-batches
-- backwarded in order 0..m-1 and refuses it (pipeline_check.c).
return function(shape)
  local list, s, last = {}, shape.stage, shape.stages - 1
  local function put(op, mb) list[#list + 1] = { op = op, mb = mb } end
  for mb = 0, shape.microbatches - 1 do
    if s > 0 then put("RECV_ACT", mb) end
    put("FWD", mb)
    if s < last then put("SEND_ACT", mb) end
  end
  for mb = shape.microbatches - 1, 0, -1 do
    if s < last then put("RECV_GRAD", mb) end
    put("BWD", mb)
    if s > 0 then put("SEND_GRAD", mb) end
  end
  return list
end
