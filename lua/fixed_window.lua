-- Fixed window: one counter per window aligned to the epoch.
-- Translation of decide in src/algorithm/fixed_window.rs.
-- State: "<window index>:<count>".
local function fixed_window(limit, w, now, cost, raw)
  local idx = idiv(now, w)
  local count = 0
  local window, c
  if raw then
    local a, b = string.match(raw, "^(%d+):(%d+)$")
    window, c = field(a), field(b)
  end
  -- Same window, or a clock that went back by up to MAX_BACK windows: stay in the
  -- stored window. Further ahead, it is state this clock cannot have written.
  if window and c and window >= idx and window <= idx + MAX_BACK then
    idx = window
    count = c
  end
  -- Counted from the time asked: a clock that went back waits out the stored window
  -- too (the store decides on its stored time, the caller waits on its own clock).
  local reset = (idx + 1) * w - now
  local allowed = count + cost <= limit
  if allowed then
    count = count + cost
  end
  local remaining = limit - count
  if remaining < 0 then
    remaining = 0
  end
  local retry = 0
  local nxt = nil
  if allowed then
    nxt = ints(idx, count)
  else
    retry = reset
  end
  return allowed, remaining, reset, retry, reset, nxt
end

DECIDE[ALG_FIXED_WINDOW] = fixed_window
