-- redlimit: an in-flight holder's release and renewal, composed after
-- in_flight.lua only into what gives back (the admin operations, the library).

-- A release (OP_RELEASE): the holder's entry counts one fewer, same expiry. A
-- renewal (OP_RENEW): it counts `held` (what the holder knows it holds), for
-- another slot lifetime, written again if the state was lost. Translation of hold
-- in src/algorithm/in_flight.rs. Returns the new state (nil when nothing is left)
-- and how long to keep it, then the answer a peek of 1 makes of it, from the same
-- parse.
IN_FLIGHT_HOLD = function(op, limit, ttl, now, held, raw, holder)
  local hs, cs, es = in_flight_live(raw, now, ttl)
  local mine
  for i = 1, #hs do
    if hs[i] == holder and not mine then
      mine = i
    end
  end
  if op == OP_RELEASE then
    if mine then
      cs[mine] = cs[mine] - 1
    end
  elseif mine then
    cs[mine], es[mine] = held, now + ttl
  else
    local n = #hs + 1
    hs[n], cs[n], es[n] = holder, held, now + ttl
  end
  local nxt, keep = in_flight_state(hs, cs, es, now)
  if nxt == "" then
    nxt = nil
  end
  local allowed, remaining, reset, retry = in_flight_on(limit, ttl, now, holder, hs, cs, es, true)
  return nxt, keep, allowed, remaining, reset, retry
end

-- Slots are given back by their release, never by a refund of units.
local function in_flight_refund()
  return nil
end

REFUND[ALG_IN_FLIGHT] = in_flight_refund
