-- Fixed window: one counter per window aligned to the epoch.
-- Translation of decide in src/algorithm/fixed_window.rs.
-- State: "<window index>:<count>".

-- The state's reading, shared by the check, the refund and the charge: the window
-- a decision counts in and its count, and whether the stored state is that
-- window's. The stored window counts when it is the current one, or up to
-- MAX_BACK windows ahead (a clock that went back: stay in the stored window);
-- further ahead, it is state this clock cannot have written, read as fresh.
local function fw_read(raw, w, now)
  local idx = idiv(now, w)
  if raw then
    local a, b = string.match(raw, "^(%d+):(%d+)$")
    local window, c = field(a), field(b)
    if window and c and window >= idx and window <= idx + MAX_BACK then
      return window, c, true
    end
  end
  return idx, 0, false
end

local function fixed_window(limit, w, now, cost, raw)
  local idx, count = fw_read(raw, w, now)
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
