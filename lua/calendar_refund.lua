-- redlimit: the calendar quota's refund, composed after calendar.lua only into
-- what gives units back (the admin operations, the give-back, the library).

-- Refund: the current period's count goes down by cost, not below 0; a period
-- that has ended since keeps nothing to refund. Translation of refund in
-- src/algorithm/calendar.rs.
REFUND[ALG_CALENDAR] = function(_, e, now, cost, ending, count)
  local stored
  ending, count, stored = calendar_at(e, now, ending, count)
  if stored and count > 0 then
    return ending, max(count - cost, 0)
  end
  return nil
end
