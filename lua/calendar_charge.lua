-- redlimit: the calendar quota's charge, composed after calendar.lua (and its
-- refund) only into what charges units (the admin operations, the library).

-- Charge: the current period's count goes up by cost whatever the limit (a new
-- period starts at cost), to at most MAX_DEBT limits; kept to the period's end.
-- Translation of charge in src/algorithm/calendar.rs. Returns the new state and
-- its TTL.
local function calendar_charge(limit, e, now, cost, raw)
  local ending, count, _, at = calendar(limit, e, now, nil, raw)
  count = math.max(count, math.min(MAX_DEBT * limit, count + cost))
  return ints(ending, count), ending - at
end

CHARGE[ALG_CALENDAR] = calendar_charge
