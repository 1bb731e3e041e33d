-- redlimit: the fixed window's refund, composed after fixed_window.lua only into what
-- gives units back (the admin operations, the give-back, the library): a check
-- never defines what it never runs.

-- Refund: the current window's count goes down by cost, not below 0; a window
-- that has changed since keeps nothing to refund. Translation of refund in
-- src/algorithm/fixed_window.rs. Returns the new state, or nil when nothing changes.
local function fixed_window_refund(limit, w, now, cost, raw)
  local idx, count, stored = fixed_window(limit, w, now, nil, raw)
  if stored and count > 0 then
    return ints(idx, math.max(count - cost, 0))
  end
  return nil
end

REFUND[ALG_FIXED_WINDOW] = fixed_window_refund
