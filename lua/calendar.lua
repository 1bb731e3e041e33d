-- Calendar quota: one counter per calendar period (a day, a week or a month in a
-- time zone). Translation of decide_in in src/algorithm/calendar.rs.
-- State: the period's end (ms) and its count, packed ">I6I6" (12 bytes), or
-- ">I7I7" when either reaches 2^48.
--
-- Lua has no time zone database: the store computes the end of the current
-- period in Rust, from its own view of now, and sends it where the other
-- algorithms send their window (e, POLICY N). A stored end equal to e, or ahead
-- of it by at most CALENDAR_MAX_AHEAD ms (a clock that went back), is the
-- period counted; any other is read as fresh. A now at or past e (this clock
-- ahead of the one that computed e, at a boundary) decides in the period e ends
-- as at its last millisecond: a reset of 1 ms, after which the store sends the
-- next period's end.

local function calendar_read(raw)
  if raw then
    local len = #raw
    if len == 12 then
      local ending, count = sunpack(">I6I6", raw)
      return ending, count, nil, ending
    elseif len == 14 then
      local ending, count = sunpack(">I7I7", raw)
      return ending, count, nil, ending
    end
  end
  return nil
end

-- The decision at `now` in the period a stored end names (see above); the refund
-- and the charge read the period the same way: this with a cost of 0.
local function calendar_step(limit, e, now, cost, ending, count)
  if not (ending and ending >= e and ending - e <= CALENDAR_MAX_AHEAD) then
    ending, count = e, 0
  end
  if now > ending - 1 then
    now = ending - 1
  end
  local reset = ending - now
  if count + cost <= limit then
    count = count + cost
    return true, limit - count, reset, 0, ending, count
  end
  return false, max(limit - count, 0), reset, reset, ending, count
end

-- Kept to the period's end: a state written in the stored period keeps its TTL.
local function calendar_encode(e, now, ending, count, _, keep)
  local raw
  if ending < WIDE_AT and count < WIDE_AT then
    raw = pack(">I6I6", ending, count)
  else
    raw = pack(">I7I7", ending, count)
  end
  return raw, ending - min(now, ending - 1), keep == true or keep == ending
end

READ[ALG_CALENDAR], STEP[ALG_CALENDAR], ENCODE[ALG_CALENDAR] =
  calendar_read, calendar_step, calendar_encode
