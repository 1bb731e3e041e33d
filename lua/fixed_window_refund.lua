-- redlimit: the fixed window's refund, composed after fixed_window.lua only into what
-- gives units back (the admin operations, the give-back, the library).

-- Refund: the current window's count goes down by cost, not below 0; a window
-- that has changed since keeps nothing to refund. Translation of refund in
-- src/algorithm/fixed_window.rs.
REFUND[ALG_FIXED_WINDOW] = function(limit, w, now, cost, idx, count)
  local _, _, _, _, window, counted = fixed_window_step(limit, w, now, 0, idx, count)
  if window == idx and counted > 0 then
    return window, max(counted - cost, 0)
  end
  return nil
end
