-- redlimit: the token bucket's refund, composed after token_bucket.lua only into what
-- gives units back (the admin operations, the give-back, the library).

-- Refund: the TAT moves back by cost emission intervals, not before now (now
-- clamped as the check clamps it). Translation of refund in src/algorithm/token_bucket.rs.
REFUND[ALG_TOKEN_BUCKET] = function(limit, t, now_ms, cost, stored)
  local _, _, now, tat, counted = token_bucket_at(limit, t, now_ms, stored)
  if not counted then
    return nil
  end
  local back = max(tat - cost * t, now)
  if back < tat then
    return back
  end
  return nil
end
