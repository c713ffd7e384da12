-- send_no_recv.lua — wrong on purpose: stage 1 forgets to receive micro-batch 2's
-- activations that stage 0 sends. Refused at the send: "stage 0, instruction 5 (SEND_ACT
-- mb 2 chunk 0): stage 1 never receives it (it has no RECV_ACT mb 2 chunk 0)".
local gpipe = dofile((debug.getinfo(1, "S").source:sub(2):gsub("[^/]*$", "")) .. "gpipe.lua")
return function(shape)
  local list, out = gpipe(shape), {}
  for _, i in ipairs(list) do
    if not (shape.stage == 1 and i.op == "RECV_ACT" and i.mb == 2) then out[#out + 1] = i end
  end
  return out
end
