-- redlimit: the sliding window's refund, composed after sliding_window.lua only into
-- what gives units back (the admin operations, the give-back, the library).

-- Refund: the current window's count goes down by cost, not below 0; once the
-- window has changed, nothing is refunded. Translation of refund in
-- src/algorithm/sliding_window.rs.
REFUND[ALG_SLIDING_WINDOW] = function(_, w, now, cost, idx, prev, cur)
  local _, stored
  idx, _, prev, cur, stored = sliding_window_at(w, now, idx, prev, cur)
  if stored and cur > 0 then
    return idx, prev, max(cur - cost, 0)
  end
  return nil
end
