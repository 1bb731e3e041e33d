-- redlimit: the sliding window's refund, composed after sliding_window.lua only into what
-- gives units back (the admin operations, the give-back, the library): a check
-- never defines what it never runs.

-- Refund: the current window's count goes down by cost, not below 0; once the
-- window has changed, nothing is refunded. Translation of refund in
-- src/algorithm/sliding_window.rs. Returns the new state, or nil when nothing changes.
local function sliding_window_refund(_limit, w, now, cost, raw)
  local a, b, d = string.match(raw, "^(%d+):(%d+):(%d+)$")
  local window, p, c = field(a), field(b), field(d)
  local idx = idiv(now, w)
  if window and p and c and window >= idx and window <= idx + MAX_BACK and c > 0 then
    return ints(window, p, math.max(c - cost, 0))
  end
  return nil
end

REFUND[ALG_SLIDING_WINDOW] = sliding_window_refund
