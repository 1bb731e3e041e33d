-- redlimit: the sliding window's refund, composed after sliding_window.lua only into what
-- gives units back (the admin operations, the give-back, the library): a check
-- never defines what it never runs.

-- Refund: the current window's count goes down by cost, not below 0; once the
-- window has changed, nothing is refunded. Translation of refund in
-- src/algorithm/sliding_window.rs. Returns the new state, or nil when nothing changes.
local function sliding_window_refund(limit, w, now, cost, raw)
  local idx, _, prev, cur, stored = sliding_window(limit, w, now, nil, raw)
  if stored and cur > 0 then
    return ints(idx, prev, math.max(cur - cost, 0))
  end
  return nil
end

REFUND[ALG_SLIDING_WINDOW] = sliding_window_refund
