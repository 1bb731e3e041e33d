-- redlimit: the token bucket's charge, composed after token_bucket.lua (and its
-- refund) only into what charges units (the admin operations, the library).

-- Charge: the TAT becomes max(tat, now) + cost emission intervals, at most
-- MAX_DEBT fill times after the time asked (a check reads more than MAX_BACK + 1
-- fill times ahead as foreign); kept until it has passed. Translation of charge
-- in src/algorithm/token_bucket.rs. Returns the new state and its TTL.
local function token_bucket_charge(limit, t, now_ms, cost, raw)
  -- The state a check would read.
  local tolerance, asked, _, tat = token_bucket(limit, t, now_ms, nil, raw)
  local most = asked + MAX_DEBT * tolerance
  -- More than MAX_DEBT fills' worth cannot fit: cost * t stays small.
  cost = math.min(cost, MAX_DEBT * limit)
  local charged = math.max(tat, math.min(most, tat + cost * t))
  return int(charged), cdiv(charged - asked, 1000)
end

CHARGE[ALG_TOKEN_BUCKET] = token_bucket_charge
