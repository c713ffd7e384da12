-- loom.ckpt — `loom ckpt info CKPT` (what a checkpoint holds, every byte's checksum
-- verified first) and `loom ckpt export CKPT OUT.safetensors` (the model's weights as one
-- safetensors file under their logical names, from any tp x pp layout).
-- CKPT is a checkpoint (a step_* directory) or a checkpoint dir (its newest complete
-- checkpoint). The format is checkpoint.h's; the checks are loom_ckpt_verify's (C), so
-- info reads the headers only after they were found intact.
-- (the --help texts are loom.help's "ckpt", "ckpt info" and "ckpt export" entries)
local core = require "loom.core"
local json = require "loom.json"

local function resolve(ckpt, what)
  local f = io.open(ckpt .. "/manifest.json", "rb")
  if f then
    f:close()
    return ckpt
  end
  local found, why = core.find_checkpoint(ckpt)
  if not found then error("ckpt " .. what .. ": " .. why, 0) end
  return found
end

local function read_json(path, len_prefixed)
  local f = assert(io.open(path, "rb"))
  local text
  if len_prefixed then -- safetensors: 8-byte little-endian header length, then the JSON
    text = f:read(string.unpack("<I8", f:read(8)))
  else
    text = f:read("a")
  end
  f:close()
  return json.decode(text)
end

-- checkpoint.h's file names (loom_ckpt_file_name)
local function file_name(kind, part, tp, pp)
  if tp <= 1 and pp <= 1 then return kind .. ".safetensors" end
  if pp <= 1 then return string.format("%s.tp%d.safetensors", kind, part) end
  if tp <= 1 then return string.format("%s.pp%d.safetensors", kind, part) end
  return string.format("%s.pp%d.tp%d.safetensors", kind, part // tp, part % tp)
end

-- The files of one kind of a layout (checkpoint.h: loom_ckpt_kind_name): tp x pp parts,
-- each one file per dp rank when the kind is in layout.slices (ZeRO's slice files).
local function kind_files(kind, l)
  local tp, pp, sliced = l.tp or 1, l.pp or 1, false
  for _, k in ipairs(l.slices or {}) do sliced = sliced or k == kind end
  local per, names = sliced and l.dp or 1, {}
  for i = 0, tp * pp * per - 1 do
    local name = file_name(kind, i // per, tp, pp)
    if sliced then name = name:gsub("%.safetensors$", string.format(".dp%d.safetensors", i % per)) end
    names[#names + 1] = name
  end
  return names
end

local function dims(t) return "[" .. table.concat(t, ", ") .. "]" end

-- "[0:8, 4:8]" for a stored slice of a logical shape; "whole" when it is all of it.
local function slice_text(start, len, shape)
  local parts, whole = {}, true
  for d = 1, #shape do
    parts[d] = string.format("%d:%d", start[d], start[d] + len[d])
    whole = whole and start[d] == 0 and len[d] == shape[d]
  end
  return whole and "whole" or "[" .. table.concat(parts, ", ") .. "]"
end

-- The tensors of one kind's files, in file order: {name, shape, dtype, where = {"file
-- slice", ...}}, each name once.
local function tensors_of(dir, kind, l)
  local list, by_name = {}, {}
  for _, name in ipairs(kind_files(kind, l)) do
    local h = read_json(dir .. "/" .. name, true)
    local meta = h.__metadata__ or {}
    local order = {}
    for tname, t in pairs(h) do
      if tname ~= "__metadata__" then order[#order + 1] = { tname, t } end
    end
    table.sort(order, function(a, b) return a[2].data_offsets[1] < b[2].data_offsets[1] end)
    for _, nt in ipairs(order) do
      local stored, t = nt[1], nt[2]
      local layout = json.decode(meta[stored])
      local tname = stored:gsub("#%d+$", "") -- a slice file's box of the tensor (checkpoint.h)
      local e = by_name[tname]
      if not e then
        e = { name = tname, shape = layout.shape, dtype = t.dtype, where = {} }
        by_name[tname] = e
        list[#list + 1] = e
      end
      e.where[#e.where + 1] = name .. " " .. slice_text(layout.slice_start, t.shape, layout.shape)
    end
  end
  return list
end

local function info(args)
  if #args ~= 1 then error("usage: loom ckpt info CKPT  (loom ckpt info --help)", 0) end
  local dir = resolve(args[1], "info")
  local ok, checked = pcall(core.verify_checkpoint, dir)
  if not ok then error("ckpt info: " .. checked .. "\nckpt info: the checkpoint is damaged", 0) end
  local m = read_json(dir .. "/manifest.json")
  local l = m.layout or { tp = 1 }
  local tp, pp = l.tp or 1, l.pp or 1
  local mc, o = m.model, m.optimizer
  print("checkpoint " .. dir)
  print(string.format("step %d (optimizer steps taken %d), written by loom %s", m.step,
    m.steps_taken, tostring(m.loom_version)))
  local dp = l.zero and string.format("saved under zero=%d over dp=%d (%s; any layout loads it)",
    l.zero, l.dp or 0, l.slices and ("each dp rank's partition in its own " .. table.concat(l.slices, " and ")
    .. " slice files") or "the partitions assembled into whole tensors")
    or "dp: not recorded (the ranks of dp rank 0 write; any layout loads it)"
  print(string.format("layout: tp=%d pp=%d%s; %s", tp, pp, l.pp_layers and (", blocks per virtual stage "
    .. table.concat(l.pp_layers, ",")) or "", dp))
  print(string.format("model: vocab %d (padded %d), ctx %d, layers %d, heads %d, dim %d",
    mc.vocab, mc.vocab_padded, mc.ctx, mc.layers, mc.heads, mc.dim))
  local slots = {}
  for k = 0, o.slots - 1 do slots[#slots + 1] = "state" .. k end
  print(string.format("optimizer: %s, %d state slot%s per parameter%s", o.name, o.slots,
    o.slots == 1 and "" or "s", o.slots > 0 and (" (X." .. table.concat(slots, ", X.") .. ")") or ""))
  local prec = m.precision or {}
  print("precision state: " .. ((prec.state and #prec.state > 0) and dims(prec.state) or "none"))
  if type(m.data) == "table" and m.data.kind then
    print(string.format("data position: %s, state %s", m.data.kind, dims(m.data.state)))
  else
    print("data position: none recorded")
  end
  local seed = type(m.config) == "table" and m.config.seed
  print("rng: no generator state in the manifest"
    .. (seed and (", the recipe's seed is " .. tostring(seed)) or ""))
  local kinds = { "model", "optim" }
  if type(m.compress) == "table" then -- docs/COMPRESS.md: every dp rank's residual
    kinds[3] = "residual"
    local ep = math.tointeger(m.compress.ep) or 1 -- under ep: an expert's slot k is 0 unless rank k holds it
    print(string.format("gradient compression: %s over dp=%d%s (residual files: dp rank k's "
      .. "residual of X as X.state<k>; a resume needs dp=%d%s)", m.compress.method, m.compress.dp,
      ep > 1 and string.format(", experts over their edp groups at ep=%d", ep) or "",
      m.compress.dp, ep > 1 and string.format(" and ep=%d", ep) or ""))
  end
  local files = {}
  for _, kind in ipairs(kinds) do
    for _, name in ipairs(kind_files(kind, l)) do files[#files + 1] = name end
  end
  print(string.format("files (%d tensor files and manifest.json):", #files))
  for _, name in ipairs(files) do
    local r = m.files[name]
    print(string.format("  %-32s %12d bytes  xxh64 %s", name, r.bytes, r.xxh64))
  end
  for _, kind in ipairs { "model", "optim" } do
    local list = tensors_of(dir, kind, l)
    print(string.format("%s tensors (%d; logical shape, dtype, file and slice held):", kind, #list))
    for _, e in ipairs(list) do
      print(string.format("  %-28s %-16s %-4s %s", e.name, dims(e.shape), e.dtype,
        table.concat(e.where, "; ")))
    end
  end
  print(string.format("checksums verified: %d bytes (manifest, every file's xxh64, headers, "
    .. "every tile)", checked))
end

-- A loom.llama checkpoint in Hugging Face LlamaForCausalLM's names and layout: the weights
-- as model.safetensors-style tensors (loom's q/k rows already use HF's rotate_half RoPE
-- layout, so no permutation; the vocabulary without its padding rows) and a config.json
-- beside OUT, so transformers' from_pretrained can load the directory.
local function export_llama(session, manifest, dir, out)
  local mc, moe = manifest.model, manifest.model.moe
  local names, rows = { wte = "model.embed_tokens.weight", ["ln_f.weight"] = "model.norm.weight",
    ["lm_head.weight"] = "lm_head.weight" }, { wte = mc.vocab, ["lm_head.weight"] = mc.vocab }
  local per = {
    ["ln_1.weight"] = "input_layernorm.weight", ["attn.q.weight"] = "self_attn.q_proj.weight",
    ["attn.k.weight"] = "self_attn.k_proj.weight", ["attn.v.weight"] = "self_attn.v_proj.weight",
    ["attn.proj.weight"] = "self_attn.o_proj.weight",
    ["ln_2.weight"] = "post_attention_layernorm.weight",
    ["mlp.gate.weight"] = "mlp.gate_proj.weight", ["mlp.up.weight"] = "mlp.up_proj.weight",
    ["mlp.proj.weight"] = "mlp.down_proj.weight" }
  if moe then -- Mixtral: every block's MLP is the router (gate) and E SwiGLU experts w1/w3/w2
    per["mlp.gate.weight"], per["mlp.up.weight"], per["mlp.proj.weight"] = nil, nil, nil
    per["moe.router.weight"] = "block_sparse_moe.gate.weight"
    for e = 0, moe.experts - 1 do
      local x, hf = "moe.expert." .. e .. ".", "block_sparse_moe.experts." .. e .. "."
      per[x .. "gate.weight"], per[x .. "up.weight"] = hf .. "w1.weight", hf .. "w3.weight"
      per[x .. "proj.weight"] = hf .. "w2.weight"
    end
  end
  for l = 0, mc.layers - 1 do
    for k, v in pairs(per) do
      names[string.format("h.%d.%s", l, k)] = string.format("model.layers.%d.%s", l, v)
    end
  end
  local bytes = session:export_safetensors(out, { format = "pt", ["loom.source"] = dir,
    ["loom.step"] = tostring(manifest.step) }, { names = names, rows = rows })
  local config = {
    architectures = { "LlamaForCausalLM" }, model_type = "llama", vocab_size = mc.vocab,
    hidden_size = mc.dim, intermediate_size = mc.ffn_dim, num_hidden_layers = mc.layers,
    num_attention_heads = mc.heads, num_key_value_heads = mc.kv_heads,
    head_dim = mc.dim // mc.heads, max_position_embeddings = mc.ctx,
    -- the manifest's floats are exact (%.9g); 7 digits give back the float and read as 1e-05
    rms_norm_eps = tonumber(string.format("%.7g", mc.norm_eps)),
    rope_theta = tonumber(string.format("%.7g", mc.rope_theta)),
    tie_word_embeddings = mc.tie_embeddings and true or false,
    hidden_act = "silu", attention_bias = false, mlp_bias = false, torch_dtype = "float32",
  }
  if moe then -- MixtralConfig's fields; its routing: top-k of softmax, renormalised (k >= 2)
    config.architectures, config.model_type = { "MixtralForCausalLM" }, "mixtral"
    config.attention_bias, config.mlp_bias = nil, nil
    config.num_local_experts, config.num_experts_per_tok = moe.experts, moe.top_k
    config.router_aux_loss_coef = tonumber(string.format("%.7g", moe.aux_loss))
    config.output_router_logits, config.router_jitter_noise = false, 0.0
  end
  local cpath = (out:match("^(.*)/[^/]*$") or ".") .. "/config.json"
  local f = assert(io.open(cpath, "wb"))
  f:write(require("loom.json").encode(config), "\n")
  f:close()
  print(string.format("wrote %s (%d bytes: Hugging Face %s names and layout, F32) and %s from %s",
    out, bytes, moe and "Mixtral" or "Llama", cpath, dir))
  if moe and moe.capacity_factor > 0 then
    print(string.format("note: Mixtral routes dropless; this model trained with capacity_factor "
      .. "%g, so where loom would drop an expert's overflow Hugging Face's forward keeps it", moe.capacity_factor))
  end
end

local function export(args, open_checkpoint)
  local usage = "usage: loom ckpt export CKPT OUT.safetensors  (loom ckpt export --help)"
  if #args ~= 2 then error(usage, 0) end
  local out = args[2]
  local session, manifest, dir = open_checkpoint(args[1], "ckpt export")
  local mc = manifest.model
  local moe = mc.moe
  if mc.family == "llama" and moe and moe.every ~= 1 then
    error(string.format("loom ckpt export %s: moe.every=%d mixes dense and MoE blocks, and "
      .. "Hugging Face's Mixtral layout has an MoE MLP in every block (no Mixtral equivalent); "
      .. "export a model trained with moe.every=1", dir, moe.every), 0)
  end
  if mc.family == "llama" and moe and moe.top_k == 1 then
    error(string.format("loom ckpt export %s: moe.top_k=1 gates by the raw router probability "
      .. "(Switch), while Mixtral renormalises the chosen gates (a single expert's gate is 1), "
      .. "so Hugging Face's forward would differ; export a model trained with top_k >= 2", dir), 0)
  end
  if mc.family == "llama" then return export_llama(session, manifest, dir, out) end
  local model = string.format('{"vocab":%d,"vocab_padded":%d,"ctx":%d,"layers":%d,"heads":%d,"dim":%d}',
    mc.vocab, mc.vocab_padded, mc.ctx, mc.layers, mc.heads, mc.dim)
  local bytes = session:export_safetensors(out, {
    format = "pt", ["loom.source"] = dir, ["loom.step"] = tostring(manifest.step), ["loom.model"] = model,
  })
  print(string.format("wrote %s (%d bytes: the model's weights, F32, logical names and shapes) from %s",
    out, bytes, dir))
end

return function(args, open_checkpoint)
  local sub = args[1]
  local rest = table.move(args, 2, #args, 1, {})
  if sub == "info" then return info(rest) end
  if sub == "export" then return export(rest, open_checkpoint) end
  error("ckpt: " .. (sub and ("unknown subcommand '" .. sub .. "'") or "which subcommand?")
    .. " (info or export)\nusage: loom ckpt info CKPT | loom ckpt export CKPT OUT.safetensors", 0)
end
