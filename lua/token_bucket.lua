-- Token bucket as GCRA: one theoretical arrival time (TAT) in microseconds.
-- Translation of decide in src/algorithm/token_bucket.rs.
-- State: the TAT as a decimal integer (Redis keeps it as a bare integer, the
-- smallest value it stores).

local function token_bucket_read(raw)
  if raw then
    local tat = tonum(raw)
    if tat and tat >= 0 and tat < 9007199254740992 and tat == floor(tat) then
      return tat, nil, nil, false
    end
  end
  return nil
end

-- What a decision at `now_ms` reads: the bucket's tolerance (its fill time, us),
-- the time asked and the time it decides at (us), and its TAT. A TAT more than
-- MAX_BACK + 1 fill times ahead is no clock that went back (a bucket admits one
-- fill time ahead) but state this clock cannot have written, read as fresh. A
-- clock that went back is clamped to the last moment the stored state can
-- describe (an empty bucket), so the bucket never looks fuller. Shared by the
-- check, the refund and the charge.
local function token_bucket_at(limit, t, now_ms, stored)
  local tolerance = limit * t
  local asked = now_ms * 1000
  if stored and stored - asked <= (MAX_BACK + 1) * tolerance then
    local now = asked
    local empty_at = stored - tolerance
    if empty_at > now then
      now = empty_at
    end
    if stored > now then
      return tolerance, asked, now, stored, true
    end
    return tolerance, asked, now, now, true
  end
  return tolerance, asked, asked, asked, false
end

local function token_bucket_step(limit, t, now_ms, cost, stored)
  local tolerance, asked, now, tat = token_bucket_at(limit, t, now_ms, stored)
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
  if allowed then
    return true, remaining, reset, 0, kept
  end
  return false, remaining, reset, cdiv(new_tat - tolerance - asked, 1000), kept
end

-- Kept until the TAT has passed. The TAT goes as a number: Redis formats it
-- ("%.17g", exact below 2^53) and keeps it as an integer.
local function token_bucket_write(key, _, now, tat, _, _, keep)
  if keep == true then
    call("SET", key, tat, "KEEPTTL")
  else
    call("SET", key, tat, "PX", ttl_text(cdiv(tat - now * 1000, 1000)))
  end
end

READ[ALG_TOKEN_BUCKET], STEP[ALG_TOKEN_BUCKET], WRITE[ALG_TOKEN_BUCKET] =
  token_bucket_read, token_bucket_step, token_bucket_write
