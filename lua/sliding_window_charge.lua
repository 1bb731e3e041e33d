-- redlimit: the sliding window's charge, composed after sliding_window.lua (and
-- its refund) only into what charges units (the admin operations, the library).

-- Charge: the current window's count goes up by cost whatever the limit, the
-- windows rolled as the check rolls them, to at most what keeps the sliding count
-- within MAX_DEBT limits and every count times the window under 2^53; kept as the
-- check keeps what it admits. Translation of charge in
-- src/algorithm/sliding_window.rs. Returns the new state and its TTL.
local function sliding_window_charge(limit, w, now, cost, raw)
  local asked = now
  -- The windows a check would read.
  local idx, prev, cur
  idx, now, prev, cur = sliding_window(limit, w, now, nil, raw)
  local elapsed = now - idx * w
  local weighted = prev * (w - elapsed)
  -- The most counts a state may hold: most * w is exact.
  local most = math.min(MAX_DEBT * limit, idiv(9007199254740991, w))
  local room = idiv(math.max(most * w - weighted, 0), w)
  cur = math.max(cur, math.min(room, cur + cost))
  -- As the check's reset with cur > 0, from the time asked.
  return ints(idx, prev, cur), (now - asked) + 2 * w - elapsed
end

CHARGE[ALG_SLIDING_WINDOW] = sliding_window_charge
