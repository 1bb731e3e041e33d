-- redlimit: the fixed window's charge, composed after fixed_window.lua (and its
-- refund) only into what charges units (the admin operations, the library).

-- Charge: the current window's count goes up by cost whatever the limit (a new
-- window starts at cost), to at most MAX_DEBT limits; kept to the window's end.
-- Translation of charge in src/algorithm/fixed_window.rs.
CHARGE[ALG_FIXED_WINDOW] = function(limit, w, now, cost, idx, count)
  local _, _, _, _, window, counted = fixed_window_step(limit, w, now, 0, idx, count)
  return window, max(counted, min(MAX_DEBT * limit, counted + cost))
end
