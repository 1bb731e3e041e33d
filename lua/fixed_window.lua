-- Fixed window: one counter per window aligned to the epoch.
-- Translation of decide in src/algorithm/fixed_window.rs.
-- State: "<window index>:<count>".

-- The state's reading comes first, shared by the check, the refund and the
-- charge: called without a cost (fixed_window(limit, w, now, nil, raw)), it
-- returns only that: the window a decision counts in, its count, and whether the
-- stored state is that window's. The stored window counts when it is the current
-- one, or up to MAX_BACK windows ahead (a clock that went back: stay in the stored
-- window); further ahead, it is state this clock cannot have written, read as
-- fresh. (In the check rather than a function of its own: a script defines its
-- functions again on every call, and callgrind counts the difference.)
local function fixed_window(limit, w, now, cost, raw)
  local idx = idiv(now, w)
  local count, stored = 0, false
  if raw then
    local a, b = string.match(raw, "^(%d+):(%d+)$")
    local window, c = field(a), field(b)
    if window and c and window >= idx and window <= idx + MAX_BACK then
      idx, count, stored = window, c, true
    end
  end
  if not cost then
    return idx, count, stored
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
