-- redlimit: the calendar quota's refund, composed after calendar.lua only into
-- what gives units back (the admin operations, the give-back, the library).

-- Refund: the current period's count goes down by cost, not below 0; a period
-- that has ended since keeps nothing to refund. Translation of refund in
-- src/algorithm/calendar.rs. Returns the new state, or nil when nothing changes.
local function calendar_refund(limit, e, now, cost, raw)
  local ending, count, stored = calendar(limit, e, now, nil, raw)
  if stored and count > 0 then
    return ints(ending, math.max(count - cost, 0))
  end
  return nil
end

REFUND[ALG_CALENDAR] = calendar_refund
