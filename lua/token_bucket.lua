-- Token bucket as GCRA: one theoretical arrival time (TAT) in microseconds.
-- Translation of decide in src/algorithm/token_bucket.rs.
-- State: the TAT as a decimal integer (Redis keeps it as a bare integer, the
-- smallest value it stores).

local function token_bucket_read(raw)
  if raw then
    local tat = tonum(raw)
    if tat and tat >= 0 and tat < 9007199254740992 and tat % 1 == 0 then
      return tat, nil, nil, false
    end
  end
  return nil
end

-- The decision at `now_ms`. A TAT more than MAX_BACK + 1 fill times ahead is no
-- clock that went back (a bucket admits one fill time ahead) but state this clock
-- cannot have written, read as fresh. A clock that went back is clamped to the last
-- moment the stored state can describe (an empty bucket), so the bucket never
-- looks fuller. Returns the TAT the decision leaves (the one it read when denied).
-- The charge reads the bucket the same way: this with a cost of 0.
local function token_bucket_step(limit, t, now_ms, cost, stored)
  -- The bucket's tolerance (its fill time), the time asked and the time it decides
  -- at, in us.
  local tolerance = limit * t
  local asked = now_ms * 1000
  local now, tat = asked, asked
  if stored and stored - asked <= (MAX_BACK + 1) * tolerance then
    if stored - tolerance > now then
      now = stored - tolerance
    end
    tat = stored > now and stored or now
  end
  local new_tat = tat + cost * t
  local allowed = new_tat - now <= tolerance
  local kept = allowed and new_tat or tat
  -- Waits are counted from the time asked: a clamped clock waits for the stored
  -- time too. (cdiv and idiv, in place: a call is a visible share of a decision.)
  local ahead = kept - asked
  local reset = (ahead - fmod(ahead, 1000)) / 1000
  if reset * 1000 < ahead then
    reset = reset + 1
  end
  local room = tolerance - (kept - now)
  local remaining = (room - fmod(room, t)) / t
  if allowed then
    return true, remaining, reset, 0, kept
  end
  return false, remaining, reset, cdiv(new_tat - tolerance - asked, 1000), kept
end

-- The last TAT written, as text: subjects checked first in one call, on one clock,
-- mostly leave the same TAT.
local LAST_TAT, LAST_TAT_TEXT = -1, ""

-- Kept until the TAT has passed. The TAT goes as decimal text, which Redis keeps as
-- an integer ("%d" costs about half of the "%.17g" Redis formats a number with).
local function token_bucket_encode(_, now, tat, _, _, keep)
  if tat ~= LAST_TAT then
    -- int's common case in place, once int has found "%d" wide enough.
    LAST_TAT, LAST_TAT_TEXT = tat, WIDE_LONG and fmt("%d", tat) or int(tat)
  end
  local ahead = tat - now * 1000
  local ttl = (ahead - fmod(ahead, 1000)) / 1000
  if ttl * 1000 < ahead then
    ttl = ttl + 1
  end
  return LAST_TAT_TEXT, ttl, keep == true
end

READ[ALG_TOKEN_BUCKET], STEP[ALG_TOKEN_BUCKET], ENCODE[ALG_TOKEN_BUCKET] =
  token_bucket_read, token_bucket_step, token_bucket_encode
