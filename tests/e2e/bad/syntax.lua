-- expect: syntax.lua:4: unexpected symbol near '}'
local loom = require "loom"
loom.train {
  model = },
}
