-- loom.guard — the numerical guards of loom.train's loop: a loss-spike detector, what to do
-- about a spike or a non-finite step, and which checkpoint is the last good one (the one
-- rollback reloads and retention keeps).
--
-- The detector is llm.c's OutlierDetector (train_gpt2.cu): the z-score of the step's loss
-- and of its gradient norm against the mean and standard deviation of a window of earlier
-- steps. Two differences, both on purpose: the window holds the steps before this one (a
-- spike does not widen the spread it is measured against), and only steps whose update was
-- applied enter it (a skipped or rolled-back spike never does; under "warn" every applied
-- step does). Until the window is full, or while its spread is 0, nothing is a spike.
-- The window starts empty on resume (as llm.c's does).
--
-- A checkpoint is good when no step since the one before it was skipped, non-finite or a
-- spike; a resumed-from checkpoint is good. So in a run that diverges, the checkpoints it
-- takes while skipping are never the good one, and retention keeps the one before.
local guard = {}
guard.__index = guard

local POLICIES = { warn = true, skip = true, rollback = true, stop = true }
guard.policies = { "warn", "skip", "rollback", "stop" }

-- guard.new{ policy = nil | "warn" | ..., window = 100, threshold = 6, nonfinite = "skip" |
-- "stop" | "rollback", max_rollbacks = 3, max_skipped = 50 }
function guard.new(t)
  assert(t.policy == nil or POLICIES[t.policy])
  local g = setmetatable({
    policy = t.policy, window = t.window or 100, threshold = t.threshold or 6,
    nonfinite = t.nonfinite or "skip", max_rollbacks = t.max_rollbacks or 3,
    max_skipped = t.max_skipped == nil and 50 or t.max_skipped,
    loss = {}, norm = {}, at = 0, rollbacks = 0, skipped_run = 0, first_skipped = nil,
    clean = true, last_good = nil, last_good_step = nil,
  }, guard)
  return g
end

local function stats(w)
  local n, sum, sq = #w, 0, 0
  for i = 1, n do sum = sum + w[i]; sq = sq + w[i] * w[i] end
  local mean = sum / n
  local var = sq / n - mean * mean
  return mean, var > 0 and math.sqrt(var) or 0
end

-- The limits to give s:step for this step ({ loss = max, norm = max }), or nil: only when
-- the policy keeps a spike's update out (skip, rollback, stop) and the window is full.
function guard:limits()
  if not self.policy or self.policy == "warn" or #self.loss < self.window then return nil end
  local ml, sl = stats(self.loss)
  local mn, sn = stats(self.norm)
  return { loss = sl > 0 and ml + self.threshold * sl or nil,
           norm = sn > 0 and mn + self.threshold * sn or nil }
end

-- "loss 9.31 (z 12.4 against 4.12 +- 0.42 over the last 100 steps)" for a value that is
-- above the threshold, nil otherwise.
local function judge(self, w, v, what)
  if #w < self.window or v ~= v then return nil end
  local mean, sd = stats(w)
  if sd == 0 then return nil end
  local z = (v - mean) / sd
  if z <= self.threshold then return nil end
  return string.format("%s %.4g (z %.1f against %.4g +- %.3g over the last %d steps)", what, v, z,
    mean, sd, #w)
end

local function push(self, w, v)
  if #w < self.window then w[#w + 1] = v else w[self.at % self.window + 1] = v end
end

-- After each step: its verdict — nil (fine), or { kind = "spike" | "nonfinite", what =
-- text, policy = what to do }. Updates the window, the clean flag and the run of skips.
function guard:observe(r)
  local verdict
  if r.nonfinite then
    verdict = { kind = "nonfinite", what = r.nonfinite.message, policy = self.nonfinite }
  elseif self.policy then
    local why = judge(self, self.loss, r.loss, "loss") or judge(self, self.norm, r.grad_norm, "grad norm")
    if r.spike and not why then -- s:step's limit and the z-score differ by a rounding
      why = string.format("loss %.4g, grad norm %.4g: above the window's limit", r.loss, r.grad_norm)
    end
    if why and (r.spike or not r.skipped) then
      verdict = { kind = "spike", what = "loss spike: " .. why, policy = self.policy }
    end
  end
  if r.skipped or verdict then self.clean = false end
  if r.skipped then
    self.skipped_run = self.skipped_run + 1
    self.first_skipped = self.first_skipped or r.step
  else
    self.skipped_run, self.first_skipped = 0, nil
  end
  -- the window holds applied steps: unremarkable ones, and under "warn" (which only
  -- watches) every applied one, so that it follows where the run goes
  if not r.skipped and (not verdict or verdict.policy == "warn") then
    push(self, self.loss, r.loss)
    push(self, self.norm, r.grad_norm)
    self.at = self.at + 1
  end
  return verdict
end

-- The run of skipped steps is too long (max_skipped in a row): the message, or nil.
function guard:diverged()
  if self.max_skipped > 0 and self.skipped_run >= self.max_skipped then
    return string.format("steps %d-%d: %d steps in a row skipped (non-finite or spikes): the run "
      .. "has diverged and stops%s (raise max_skipped, or 0, to go on; on_nonfinite = \"rollback\" "
      .. "reloads the last good checkpoint)", self.first_skipped, self.first_skipped + self.skipped_run - 1,
      self.skipped_run, self.last_good and string.format("; the last good checkpoint is %s (step %d), "
        .. "kept by retention", self.last_good, self.last_good_step) or "")
  end
end

-- A checkpoint of step `step` was saved at path: the last good one if the steps since the
-- one before were clean.
function guard:saved(path, step)
  if self.clean then self.last_good, self.last_good_step = path, step end
  self.clean = true
end

-- The resumed-from checkpoint is good.
function guard:resumed(path, step) self.last_good, self.last_good_step = path, step end

-- The step_* name retention must keep (the last good checkpoint), or nil.
function guard:protected() return self.last_good and self.last_good:match("([^/]+)$") end

-- After a rollback: the window restarts (the steps it held are gone), the run of skips too.
function guard:rolled_back()
  self.rollbacks = self.rollbacks + 1
  self.loss, self.norm, self.at = {}, {}, 0
  self.skipped_run, self.first_skipped, self.clean = 0, nil, true
end

return guard
