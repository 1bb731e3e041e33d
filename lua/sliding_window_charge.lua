-- redlimit: the sliding window's charge, composed after sliding_window.lua (and
-- its refund) only into what charges units (the admin operations, the library).

-- Charge: the current window's count goes up by cost whatever the limit, the
-- windows rolled as the check rolls them, to at most what keeps the sliding count
-- within MAX_DEBT limits and every count times the window under 2^53; kept as the
-- check keeps what it admits. Translation of charge in
-- src/algorithm/sliding_window.rs.
CHARGE[ALG_SLIDING_WINDOW] = function(limit, w, now, cost, idx, prev, cur)
  idx, now, prev, cur = sliding_window_at(w, now, idx, prev, cur)
  local elapsed = now - idx * w
  local weighted = prev * (w - elapsed)
  -- The most counts a state may hold: most * w is exact.
  local most = min(MAX_DEBT * limit, idiv(9007199254740991, w))
  local room = idiv(max(most * w - weighted, 0), w)
  return idx, prev, max(cur, min(room, cur + cost))
end
