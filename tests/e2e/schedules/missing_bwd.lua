-- missing_bwd.lua — wrong on purpose: stage 0 never runs the backward of micro-batch 1
-- (it still receives its gradient). Refused: "stage 0, instruction 2 (FWD mb 1 chunk 0):
-- micro-batch 1 chunk 0 is forwarded but never backwarded".
local gpipe = dofile((debug.getinfo(1, "S").source:sub(2):gsub("[^/]*$", "")) .. "gpipe.lua")
return function(shape)
  local list, out = gpipe(shape), {}
  for _, i in ipairs(list) do
    if not (shape.stage == 0 and i.op == "BWD" and i.mb == 1) then out[#out + 1] = i end
  end
  return out
end
