-- redlimit: the token bucket's refund, composed after token_bucket.lua only into what
-- gives units back (the admin operations, the give-back, the library).

-- Refund: the TAT moves back by cost emission intervals, not before now (now
-- clamped as the check clamps it); a bucket the check reads as fresh keeps nothing
-- to refund. Translation of refund in src/algorithm/token_bucket.rs.
REFUND[ALG_TOKEN_BUCKET] = function(limit, t, now_ms, cost, stored)
  local tolerance, asked = limit * t, now_ms * 1000
  if not stored or stored - asked > (MAX_BACK + 1) * tolerance then
    return nil
  end
  local _, _, _, _, tat = token_bucket_step(limit, t, now_ms, 0, stored)
  local back = max(tat - cost * t, asked, stored - tolerance)
  if back < tat then
    return back
  end
  return nil
end
