-- gpipe_split.lua — GPipe with the backward split (zb1's B and W, Qi et al. 2024): all
-- forwards, then every micro-batch's input gradient (BWD_INPUT, sent on at once), then
-- every weight gradient (BWD_WEIGHT), each in micro-batch order. A list that needs the
-- engine's split backward, and that no plugin builds.
return function(shape)
  assert(shape.chunks == 1, "gpipe_split.lua has one chunk per stage")
  local list, s, last = {}, shape.stage, shape.stages - 1
  local function put(op, mb) list[#list + 1] = { op = op, mb = mb } end
  for mb = 0, shape.microbatches - 1 do
    if s > 0 then put("RECV_ACT", mb) end
    put("FWD", mb)
    if s < last then put("SEND_ACT", mb) end
  end
  for mb = 0, shape.microbatches - 1 do
    if s < last then put("RECV_GRAD", mb) end
    put("BWD_INPUT", mb)
    if s > 0 then put("SEND_GRAD", mb) end
  end
  for mb = 0, shape.microbatches - 1 do put("BWD_WEIGHT", mb) end
  return list
end
