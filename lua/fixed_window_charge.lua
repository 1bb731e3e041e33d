-- redlimit: the fixed window's charge, composed after fixed_window.lua (and its
-- refund) only into what charges units (the admin operations, the library).

-- Charge: the current window's count goes up by cost whatever the limit (a new
-- window starts at cost), to at most MAX_DEBT limits; kept to the window's end.
-- Translation of charge in src/algorithm/fixed_window.rs. Returns the new state
-- and its TTL.
local function fixed_window_charge(limit, w, now, cost, raw)
  local idx = idiv(now, w)
  local count = 0
  local window, c
  if raw then
    local a, b = string.match(raw, "^(%d+):(%d+)$")
    window, c = field(a), field(b)
  end
  -- The window a check would count in (see fixed_window.lua).
  if window and c and window >= idx and window <= idx + MAX_BACK then
    idx = window
    count = c
  end
  count = math.max(count, math.min(MAX_DEBT * limit, count + cost))
  return ints(idx, count), (idx + 1) * w - now
end

CHARGE[ALG_FIXED_WINDOW] = fixed_window_charge
