-- In flight: requests of a subject running at once, counted per holder (the
-- limiter instance that admitted them), so that a vanished instance's slots free
-- themselves: nobody renews its entry, and it stops counting once its time passes.
-- Translation of decide in src/algorithm/in_flight.rs. The decide function takes
-- the holder (6 bytes) where the others take the cost: a request takes one slot
-- whatever its cost.
--
-- State: one entry per holder that holds slots (its id, its count, when it stops
-- counting unless renewed), in the order first written, in one of two forms:
--   one holder with one slot: its id then its expiry (">I6"), 12 bytes, no more
--     Redis 7 memory than a fixed window's state;
--   anything else: a header, the total count, a time at or before the soonest
--     expiry and one at or after the latest (">I4I7I7", 18 bytes), then 17 bytes an
--     entry: its id, its count and its expiry (">I4I7").
-- While the clock is before the soonest expiry and no entry outlives a slot
-- lifetime from now, every entry counts and the header's total is the count: a
-- check reads 18 bytes, finds its own entry with one search and rewrites it, the
-- same work however many holders there are. Otherwise (an entry may have expired,
-- or comes from a clock ahead of this one) every entry is read, the dead and the
-- foreign dropped, and the header made exact again.
local IF_HEADER = 18
local IF_ENTRY = 17

local function in_flight_read(raw)
  if raw then
    local len = #raw
    if len == 12 or (len >= IF_HEADER + IF_ENTRY and (len - IF_HEADER) % IF_ENTRY == 0) then
      return raw, nil, nil, false
    end
  end
  return nil
end

-- Where `holder`'s entry starts in a state of the second form, or nil.
local function in_flight_find(raw, holder)
  local at = find(raw, holder, IF_HEADER + 1, true)
  while at do
    if (at - IF_HEADER - 1) % IF_ENTRY == 0 then
      return at
    end
    at = find(raw, holder, at + 1, true)
  end
  return nil
end

-- The entries of raw still counting at now, in order: their holders, counts and
-- expiries. Entries expiring more than MAX_BACK + 1 slot lifetimes ahead cannot
-- have been written by this clock: foreign, dropped.
local function in_flight_live(raw, now, ttl)
  local hs, cs, es = {}, {}, {}
  if not raw then
    return hs, cs, es
  end
  local horizon = now + ttl * (MAX_BACK + 1)
  if #raw == 12 then
    local e = sunpack(">I6", raw, 7)
    if e > now and e <= horizon then
      hs[1], cs[1], es[1] = sub(raw, 1, 6), 1, e
    end
    return hs, cs, es
  end
  for at = IF_HEADER + 1, #raw, IF_ENTRY do
    local c, e = sunpack(">I4I7", raw, at + 6)
    if c > 0 and e > now and e <= horizon then
      local n = #hs + 1
      hs[n], cs[n], es[n] = sub(raw, at, at + 5), c, e
    end
  end
  return hs, cs, es
end

-- The state of the entries that still count something, in the shortest form, with
-- an exact header; nil when none does.
local function in_flight_state(hs, cs, es)
  local parts, total, soonest, latest = {}, 0, nil, 0
  for i = 1, #hs do
    local c, e = cs[i], es[i]
    if c > 0 then
      parts[#parts + 1] = hs[i] .. pack(">I4I7", min(c, 4294967295), e)
      total = total + c
      if not soonest or e < soonest then
        soonest = e
      end
      if e > latest then
        latest = e
      end
    end
  end
  if total == 0 then
    return nil
  end
  if #parts == 1 and total == 1 and latest < WIDE_AT then
    return sub(parts[1], 1, 6) .. pack(">I6", latest)
  end
  return pack(">I4I7I7", min(total, 4294967295), soonest, latest) .. table.concat(parts)
end

-- The decision on every entry read (the slow path): as in_flight_step.
local function in_flight_all(limit, ttl, now, holder, raw, peek)
  local hs, cs, es = in_flight_live(raw, now, ttl)
  local count, mine = 0, nil
  for i = 1, #hs do
    count = count + cs[i]
    if hs[i] == holder and not mine then
      mine = i
    end
  end
  if count >= limit then
    -- The soonest a slot would free itself if no request ended before: a hint.
    local soonest, keep = IN_FLIGHT_RETRY_HINT, 0
    for i = 1, #es do
      local left = es[i] - now
      if left < soonest then
        soonest = left
      end
      if left > keep then
        keep = left
      end
    end
    return false, 0, keep, max(soonest, 1), raw
  end
  if peek then
    local keep = ttl
    for i = 1, #es do
      if i ~= mine and es[i] - now > keep then
        keep = es[i] - now
      end
    end
    return true, limit - count - 1, keep, 0, raw
  end
  if mine then
    cs[mine], es[mine] = cs[mine] + 1, now + ttl
  else
    local n = #hs + 1
    hs[n], cs[n], es[n] = holder, 1, now + ttl
  end
  local keep = 0
  for i = 1, #es do
    if es[i] - now > keep then
      keep = es[i] - now
    end
  end
  return true, limit - count - 1, keep, 0, in_flight_state(hs, cs, es)
end

-- The header of raw: the total, a time at or before the soonest expiry, one at or
-- after the latest (0 and nil for no state).
local function in_flight_header(raw)
  if not raw then
    return 0
  end
  if #raw == 12 then
    local e = sunpack(">I6", raw, 7)
    return 1, e, e
  end
  return sunpack(">I4I7I7", raw)
end

local function in_flight_step(limit, ttl, now, holder, raw, _, _, peek)
  -- in_flight_header, in place: no state is the common case of a check.
  local total, soonest, latest = 0, nil, nil
  if raw then
    total, soonest, latest = in_flight_header(raw)
  end
  if total > 0 and (soonest <= now or latest > now + ttl) or total >= limit then
    return in_flight_all(limit, ttl, now, holder, raw, peek)
  end
  -- Every entry counts and none outlives now + ttl, this holder's new expiry.
  if peek then
    return true, limit - total - 1, ttl, 0, raw
  end
  local e = now + ttl
  local nxt
  if total == 0 then
    if e < WIDE_AT then
      nxt = pack(">c6I6", holder, e)
    else
      nxt = pack(">I4I7I7", 1, e, e) .. holder .. pack(">I4I7", 1, e)
    end
  elseif #raw == 12 then
    local other = sub(raw, 1, 6)
    if other == holder then
      nxt = pack(">I4I7I7", 2, e, e) .. holder .. pack(">I4I7", 2, e)
    else
      nxt = pack(">I4I7I7", 2, soonest, e) .. other .. pack(">I4I7", 1, soonest)
        .. holder .. pack(">I4I7", 1, e)
    end
  else
    local head = pack(">I4I7I7", total + 1, soonest, e)
    local at = in_flight_find(raw, holder)
    if at then
      local c = sunpack(">I4", raw, at + 6)
      nxt = head .. sub(raw, IF_HEADER + 1, at + 5) .. pack(">I4I7", c + 1, e)
        .. sub(raw, at + IF_ENTRY)
    else
      nxt = head .. sub(raw, IF_HEADER + 1) .. holder .. pack(">I4I7", 1, e)
    end
  end
  -- The latest expiry (this holder's) beside the state: its write needs it.
  return true, limit - total - 1, ttl, 0, nxt, e
end

-- Kept until its last entry stops counting (`latest`, when the step that made the
-- state knew it); no entry left, no key.
local function in_flight_encode(_, now, raw, latest)
  if not raw then
    return nil
  end
  if not latest then
    local _
    _, _, latest = in_flight_header(raw)
  end
  return raw, latest - now, false
end

READ[ALG_IN_FLIGHT], STEP[ALG_IN_FLIGHT], ENCODE[ALG_IN_FLIGHT] =
  in_flight_read, in_flight_step, in_flight_encode
