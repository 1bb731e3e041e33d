-- Calendar quota: one counter per calendar period (a day, a week or a month in a
-- time zone). Translation of decide_in in src/algorithm/calendar.rs.
-- State: "<period end, ms>:<count>".
--
-- Lua has no time zone database: the store computes the end of the current
-- period in Rust, from its own view of now, and sends it where the other
-- algorithms send their window (e, POLICY_N). A stored end equal to e, or ahead
-- of it by at most CALENDAR_MAX_AHEAD ms (a clock that went back), is the
-- period counted; any other is read as fresh. A now at or past e (this clock
-- ahead of the one that computed e, at a boundary) decides in the period e ends
-- as at its last millisecond: a reset of 1 ms, after which the store sends the
-- next period's end.

-- Called without a cost (calendar(limit, e, now, nil, raw)), it returns only
-- the state's reading, shared by the check, the refund and the charge: the end
-- of the period a decision counts in, its count, whether the stored state is
-- that period's, and now as the decision reads it.
local function calendar(limit, e, now, cost, raw)
  local count, stored = 0, false
  if raw then
    local a, b = string.match(raw, "^(%d+):(%d+)$")
    local ending, c = field(a), field(b)
    if ending and c and ending >= e and ending - e <= CALENDAR_MAX_AHEAD then
      e, count, stored = ending, c, true
    end
  end
  if now > e - 1 then
    now = e - 1
  end
  if not cost then
    return e, count, stored, now
  end
  local reset = e - now
  local allowed = count + cost <= limit
  if allowed then
    count = count + cost
  end
  local remaining = limit - count
  if remaining < 0 then
    remaining = 0
  end
  local retry = 0
  local nxt = nil
  if allowed then
    nxt = ints(e, count)
  else
    retry = reset
  end
  return allowed, remaining, reset, retry, reset, nxt
end

DECIDE[ALG_CALENDAR] = calendar
