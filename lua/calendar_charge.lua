-- redlimit: the calendar quota's charge, composed after calendar.lua (and its
-- refund) only into what charges units (the admin operations, the library).

-- Charge: the current period's count goes up by cost whatever the limit (a new
-- period starts at cost), to at most MAX_DEBT limits; kept to the period's end.
-- Translation of charge in src/algorithm/calendar.rs.
CHARGE[ALG_CALENDAR] = function(limit, e, now, cost, ending, count)
  ending, count = calendar_at(e, now, ending, count)
  return ending, max(count, min(MAX_DEBT * limit, count + cost))
end
