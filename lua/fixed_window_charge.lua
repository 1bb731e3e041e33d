-- redlimit: the fixed window's charge, composed after fixed_window.lua (and its
-- refund) only into what charges units (the admin operations, the library).

-- Charge: the current window's count goes up by cost whatever the limit (a new
-- window starts at cost), to at most MAX_DEBT limits; kept to the window's end.
-- Translation of charge in src/algorithm/fixed_window.rs. Returns the new state
-- and its TTL.
local function fixed_window_charge(limit, w, now, cost, raw)
  -- The window a check would count in.
  local idx, count = fixed_window(limit, w, now, nil, raw)
  count = math.max(count, math.min(MAX_DEBT * limit, count + cost))
  return ints(idx, count), (idx + 1) * w - now
end

CHARGE[ALG_FIXED_WINDOW] = fixed_window_charge
