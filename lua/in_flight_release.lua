-- redlimit: an in-flight holder's release and renewal, composed after
-- in_flight.lua only into what gives back (the admin operations, the library).

-- A release (OP_RELEASE): the holder's entry counts one fewer, same expiry. A
-- renewal (OP_RENEW): it counts `held` (what the holder knows it holds), for
-- another slot lifetime, written again if the state was lost. Both drop the
-- entries that stopped counting. Translation of hold in src/algorithm/in_flight.rs.
-- Returns the new state (nil when nothing is left); while every entry is alive and
-- from this clock, the holder's own entry is changed in place, as a check does.
IN_FLIGHT_HOLD = function(op, ttl, now, held, holder, raw)
  if raw and #raw == 12 then
    -- One holder with one slot, alive and from this clock: its release leaves
    -- nothing; its renewal, the same form with the new expiry; another holder's
    -- release changes nothing.
    local e = sunpack(">I6", raw, 7)
    if e > now and e <= now + ttl then
      local mine = find(raw, holder, 1, true) == 1
      if op == OP_RELEASE then
        if mine then
          return nil
        end
        return raw
      elseif mine and held == 1 and now + ttl < WIDE_AT then
        return pack(">c6I6", holder, now + ttl)
      end
    end
  elseif raw then
    -- Entries under a header, every one alive and from this clock: the holder's own
    -- rewritten, removed or added in place, the header's bounds kept (a removed or
    -- renewed entry leaves them bounds still), whatever the other holders.
    local total, soonest, latest = sunpack(">I4I7I7", raw)
    local e = now + ttl
    if soonest > now and latest <= e then
      local at = in_flight_find(raw, holder)
      local c = at and sunpack(">I4", raw, at + 6) or 0
      local count = c - 1
      if op == OP_RENEW then
        count = held
      elseif not at then
        return raw
      end
      total = total - c + count
      if total <= 0 then
        return nil
      end
      local entry = ""
      if count > 0 then
        entry = pack(">c6I4I7", holder, min(count, 4294967295), op == OP_RENEW and e or sunpack(">I7", raw, at + 10))
      end
      if op == OP_RENEW then
        latest = e
      end
      local head = pack(">I4I7I7", min(total, 4294967295), soonest, latest)
      if at then
        return head .. sub(raw, IF_HEADER + 1, at - 1) .. entry .. sub(raw, at + IF_ENTRY)
      end
      return head .. sub(raw, IF_HEADER + 1) .. entry
    end
  end
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
  return in_flight_state(hs, cs, es)
end

-- Slots are given back by their release, never by a refund of units.
REFUND[ALG_IN_FLIGHT] = function()
  return nil
end
