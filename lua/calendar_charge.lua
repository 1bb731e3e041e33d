-- redlimit: the calendar quota's charge, composed after calendar.lua (and its
-- refund) only into what charges units (the admin operations, the library).

-- Charge: the current period's count goes up by cost whatever the limit (a new
-- period starts at cost), to at most MAX_DEBT limits; kept to the period's end.
-- Translation of charge in src/algorithm/calendar.rs.
CHARGE[ALG_CALENDAR] = function(limit, e, now, cost, ending, count)
  local _, _, _, _, counted_end, counted = calendar_step(limit, e, now, 0, ending, count)
  return counted_end, max(counted, min(MAX_DEBT * limit, counted + cost))
end
