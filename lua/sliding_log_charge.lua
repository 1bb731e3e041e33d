-- redlimit: the sliding log's charge, composed after sliding_log.lua (and its
-- refund) only into what charges units (the admin operations, the library).

-- Charge: cost stamps at now (clamped to the newest stamp, as the check clamps
-- it) whatever the limit, the ring keeping its last `limit`: at most `limit`
-- stamps go in, so the debt is at most one full window. Kept as the check keeps
-- what it admits. Translation of charge in src/algorithm/sliding_log.rs.
-- Returns the new state (rewritten in order, head 0) and its TTL.
local function sliding_log_charge(limit, w, now, cost, raw)
  local asked = now
  -- The log a check would read (foreign state: charged as an empty log).
  local n, head, base, len, _
  n, head, base, len, _, now = sl_read(raw, limit, w, now)
  local count = math.min(cost, limit)
  local keep = math.min(len, limit - count)
  local nxt = struct.pack(">I4", 0) .. sl_copy(raw, n, head, base, len - keep, keep)
    .. string.rep(struct.pack(">I6", now), count)
  return nxt, now + w - asked
end

CHARGE[ALG_SLIDING_LOG] = sliding_log_charge
