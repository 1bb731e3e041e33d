-- redlimit: the sliding window's charge, composed after sliding_window.lua (and
-- its refund) only into what charges units (the admin operations, the library).

-- Charge: the current window's count goes up by cost whatever the limit, the
-- windows rolled as the check rolls them, to at most what keeps the sliding count
-- within MAX_DEBT limits and every count times the window under 2^53; kept as the
-- check keeps what it admits. Translation of charge in
-- src/algorithm/sliding_window.rs.
CHARGE[ALG_SLIDING_WINDOW] = function(limit, w, now, cost, idx, prev, cur)
  local _, _, _, _, window, p, c = sliding_window_step(limit, w, now, 0, idx, prev, cur)
  -- The time the check decides at: a clock that went back, at the stored window's start.
  local elapsed = max(now, window * w) - window * w
  local weighted = p * (w - elapsed)
  -- The most counts a state may hold: most * w is exact.
  local most = min(MAX_DEBT * limit, idiv(9007199254740991, w))
  local room = idiv(max(most * w - weighted, 0), w)
  return window, p, max(c, min(room, c + cost))
end
