-- redlimit: the token bucket's refund, composed after token_bucket.lua only into what
-- gives units back (the admin operations, the give-back, the library): a check
-- never defines what it never runs.

-- Refund: the TAT moves back by cost emission intervals, not before now (now
-- clamped as the check clamps it). Translation of refund in src/algorithm/token_bucket.rs.
-- Returns the new state, or nil when nothing changes.
local function token_bucket_refund(limit, t, now_ms, cost, raw)
  local _, _, now, tat, stored = token_bucket(limit, t, now_ms, nil, raw)
  if not stored then
    return nil
  end
  local back = math.max(tat - cost * t, now)
  if back < tat then
    return int(back)
  end
  return nil
end

REFUND[ALG_TOKEN_BUCKET] = token_bucket_refund
