-- Token bucket as GCRA: one theoretical arrival time (TAT) in microseconds.
-- Translation of decide in src/algorithm/token_bucket.rs.
-- State: the TAT as a decimal integer (Redis keeps it as a bare integer).

-- The state's reading comes first, shared by the check, the refund and the
-- charge: called without a cost (token_bucket(limit, t, now_ms, nil, raw)), it
-- returns only that: the bucket's tolerance (its fill time, us), the time asked
-- and the time it decides at (us), its TAT, and whether the stored state counts.
-- A TAT more than MAX_BACK + 1 fill times ahead is no clock that went back (a
-- bucket admits one fill time ahead) but state this clock cannot have written,
-- read as fresh. A clock that went back is clamped to the last moment the stored
-- state can describe (an empty bucket), so the bucket never looks fuller. (In the
-- check rather than a function of its own: a script defines its functions again
-- on every call, and callgrind counts the difference.)
local function token_bucket(limit, t, now_ms, cost, raw)
  local tolerance = limit * t
  local asked = now_ms * 1000
  local now = asked
  local tat = now
  local stored = nil
  if raw and string.match(raw, "^%d+$") then
    stored = field(raw)
  end
  if stored and stored - asked > (MAX_BACK + 1) * tolerance then
    stored = nil
  end
  if stored then
    local empty_at = stored - tolerance
    if empty_at > now then
      now = empty_at
    end
    tat = math.max(stored, now)
  end
  if not cost then
    return tolerance, asked, now, tat, stored ~= nil
  end
  local new_tat = tat + cost * t
  local allowed = new_tat - now <= tolerance
  local kept = tat
  if allowed then
    kept = new_tat
  end
  -- Waits are counted from the time asked: a clamped clock waits for the stored
  -- time too.
  local reset = cdiv(kept - asked, 1000)
  local remaining = idiv(tolerance - (kept - now), t)
  local retry = 0
  local nxt = nil
  if allowed then
    nxt = int(kept)
  else
    retry = cdiv(new_tat - tolerance - asked, 1000)
  end
  return allowed, remaining, reset, retry, reset, nxt
end

DECIDE[ALG_TOKEN_BUCKET] = token_bucket
