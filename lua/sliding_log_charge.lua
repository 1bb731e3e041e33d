-- redlimit: the sliding log's charge, composed after sliding_log.lua (and its
-- refund) only into what charges units (the admin operations, the library).

-- Charge: cost stamps at now (clamped to the newest stamp, as the check clamps
-- it) whatever the limit, the ring keeping its last `limit`: at most `limit`
-- stamps go in, so the debt is at most one full window. Kept as the check keeps
-- what it admits. Translation of charge in src/algorithm/sliding_log.rs. The new
-- state is rewritten in order, head 0.
CHARGE[ALG_SLIDING_LOG] = function(limit, w, now, cost, raw)
  -- The log a check would read (foreign state: charged as an empty log).
  local n, head, base, len, _
  n, head, base, len, _, now = sl_read(raw, limit, w, now)
  local count = min(cost, limit)
  local keep = min(len, limit - count)
  return pack(">I4", 0) .. sl_copy(raw, n, head, base, len - keep, keep)
    .. rep(pack(">I6", now), count), now
end
