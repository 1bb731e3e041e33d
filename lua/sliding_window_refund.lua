-- redlimit: the sliding window's refund, composed after sliding_window.lua only into
-- what gives units back (the admin operations, the give-back, the library).

-- Refund: the current window's count goes down by cost, not below 0; once the
-- window has changed, nothing is refunded. Translation of refund in
-- src/algorithm/sliding_window.rs.
REFUND[ALG_SLIDING_WINDOW] = function(limit, w, now, cost, idx, prev, cur)
  local _, _, _, _, window, p, c = sliding_window_step(limit, w, now, 0, idx, prev, cur)
  if window == idx and c > 0 then
    return window, p, max(c - cost, 0)
  end
  return nil
end
