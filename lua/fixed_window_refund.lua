-- redlimit: the fixed window's refund, composed after fixed_window.lua only into what
-- gives units back (the admin operations, the give-back, the library).

-- Refund: the current window's count goes down by cost, not below 0; a window
-- that has changed since keeps nothing to refund. Translation of refund in
-- src/algorithm/fixed_window.rs.
REFUND[ALG_FIXED_WINDOW] = function(_, w, now, cost, idx, count)
  local stored
  idx, count, stored = fixed_window_at(w, now, idx, count)
  if stored and count > 0 then
    return idx, max(count - cost, 0)
  end
  return nil
end
