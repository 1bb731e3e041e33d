-- redlimit: the token bucket's charge, composed after token_bucket.lua (and its
-- refund) only into what charges units (the admin operations, the library).

-- Charge: the TAT becomes max(tat, now) + cost emission intervals, at most
-- MAX_DEBT fill times after the time asked (a check reads more than MAX_BACK + 1
-- fill times ahead as foreign); kept until it has passed. Translation of charge
-- in src/algorithm/token_bucket.rs.
CHARGE[ALG_TOKEN_BUCKET] = function(limit, t, now_ms, cost, stored)
  local _, _, _, _, tat = token_bucket_step(limit, t, now_ms, 0, stored)
  local most = now_ms * 1000 + MAX_DEBT * limit * t
  -- More than MAX_DEBT fills' worth cannot fit: cost * t stays small.
  cost = min(cost, MAX_DEBT * limit)
  return max(tat, min(most, tat + cost * t))
end
