-- loom.preflight — what loom.train checks on disk before it builds a session, and which
-- checkpoint resume=auto takes. Both would otherwise be found late: a checkpoint dir that
-- cannot be written at the first save, a validation split too small at the first eval, a
-- damaged newest checkpoint at the load (or silently passed over).
local schema = require "loom.schema"
local preflight = {}

-- What would otherwise be found only steps in, checked before the session is built: a
-- checkpoint dir that cannot be created or written (found at the first save, `every` steps
-- in), splits too small for one batch (the validation split at the first eval).
function preflight.check(core, t, data, where, origin)
  if t.checkpoint then
    local dir = t.checkpoint.dir
    local ok, err = core.mkdir_p(dir)
    local probe = dir .. "/.tmp-probe-rank" .. tostring(core.rank or 0)
    local f, ferr
    if ok then f, ferr = io.open(probe, "wb") end
    if f then f:close(); os.remove(probe) end
    if not ok or not f then
      schema.fail(where, "checkpoint.dir=\"%s\"%s: %s (give a directory this run may create and "
        .. "write, e.g. \"ckpt\")", dir, origin("checkpoint.dir") or "", err or ferr)
    end
  end
  if type(t.resume) == "string" and t.resume ~= "auto" then
    local f, err = io.open(t.resume .. "/manifest.json", "rb")
    if not f then
      schema.fail(where, "cannot resume: resume=\"%s\"%s is not a checkpoint (%s; give a step_* "
        .. "directory, or resume=\"auto\" with checkpoint.dir)", t.resume, origin("resume") or "", err)
    end
    f:close()
  end
  local jsonl = (core.rank or 0) == 0 and t.log and t.log.jsonl
  local jdir = jsonl and jsonl:match("^(.*)/[^/]*$")
  if jdir and jdir ~= "" then
    local ok, err = core.mkdir_p(jdir)
    if not ok then schema.fail(where, "metrics file '%s': %s", jsonl, err) end
  end
  if t.data.kind == "random" then return end -- unbounded
  local need = t.batch.micro * t.batch.seq + 1
  for _, split in ipairs { "train", "val" } do
    local n = data:size(split)
    if (split == "train" or t.eval) and n < need then
      schema.fail(where, "the %s split holds %d tokens, and one batch of batch.micro x batch.seq "
        .. "= %d x %d needs %d%s", split, n, t.batch.micro, t.batch.seq, need,
        split == "val" and (t.data.kind == "shards" and not t.data.val
          and " (loom.data.shards has no val glob: give val = \"...\" or leave eval out)"
          or " (raise data.val_fraction, shorten batch.seq or leave eval out)")
          or " (give more data or shorten batch.seq)")
    end
  end
end

-- resume=auto: the newest intact checkpoint in dir — the one `latest` names first, then
-- every other step_* newest first — each verified whole (manifest, sizes, checksums) before
-- it is taken, so every rank (reading the same files) takes the same one. What is passed
-- over is said, with why (incomplete: a save cut short; damaged: a checksum that fails).
-- nil, why when dir has no checkpoint at all; a dir whose every checkpoint fails is refused
-- (starting again from step 1 would silently drop the run's progress).
function preflight.pick_checkpoint(core, dir, say, where)
  local names, latest = core.list_checkpoints(dir)
  if not names then return nil, string.format("no checkpoint directory '%s'", dir) end
  if #names == 0 then return nil, string.format("no checkpoint in '%s'", dir) end
  local order = {}
  for _, n in ipairs(names) do if n == latest then table.insert(order, 1, n) else order[#order + 1] = n end end
  local skipped = {}
  for _, n in ipairs(order) do
    local path = dir .. "/" .. n
    local ok, err = pcall(core.verify_checkpoint, path)
    if ok then
      if #skipped > 0 then
        say(string.format("resume=auto: skipped %d checkpoint%s newer than %s: %s", #skipped,
          #skipped == 1 and "" or "s", n, table.concat(skipped, "; ")))
      end
      return path
    end
    skipped[#skipped + 1] = string.format("%s (%s)", n, tostring(err))
  end
  schema.fail(where, "resume=auto: no intact checkpoint in '%s': %s (remove the damaged ones "
    .. "to start afresh, or resume= a path)", dir, table.concat(skipped, "; "))
end

return preflight
