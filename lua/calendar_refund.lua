-- redlimit: the calendar quota's refund, composed after calendar.lua only into
-- what gives units back (the admin operations, the give-back, the library).

-- Refund: the current period's count goes down by cost, not below 0; a period
-- that has ended since keeps nothing to refund. Translation of refund in
-- src/algorithm/calendar.rs.
REFUND[ALG_CALENDAR] = function(limit, e, now, cost, ending, count)
  local _, _, _, _, counted_end, counted = calendar_step(limit, e, now, 0, ending, count)
  if counted_end == ending and counted > 0 then
    return counted_end, max(counted - cost, 0)
  end
  return nil
end
