-- In flight: requests of a subject running at once, counted per holder (the
-- limiter instance that admitted them), so that a vanished instance's slots free
-- themselves: nobody renews its entry, and it stops counting once its time passes.
-- Translation of decide in src/algorithm/in_flight.rs.
-- State: "<holder, 16 hex digits>:<count>:<expires ms>;" per holder, in the order
-- first written. The decide function takes the holder where the others take the
-- cost: a request takes one slot whatever its cost.

-- The entries of raw still counting at now, in order: their holders, counts and
-- expiries. Entries expiring more than MAX_BACK + 1 slot lifetimes ahead cannot
-- have been written by this clock: foreign, dropped.
local function in_flight_live(raw, now, ttl)
  local hs, cs, es = {}, {}, {}
  if raw then
    local horizon = now + ttl * (MAX_BACK + 1)
    for h, c, e in string.gmatch(raw, "(%x+):(%d+):(%d+);") do
      c, e = field(c), field(e)
      if c and e and c > 0 and e > now and e <= horizon then
        local n = #hs + 1
        hs[n], cs[n], es[n] = h, c, e
      end
    end
  end
  return hs, cs, es
end

-- The state of the entries that still count something, and how long (ms from
-- now) it must be kept: until its last entry expires.
local function in_flight_state(hs, cs, es, now)
  local parts, keep = {}, 0
  for i = 1, #hs do
    if cs[i] > 0 then
      parts[#parts + 1] = hs[i] .. ":" .. ints(cs[i], es[i]) .. ";"
      if es[i] - now > keep then
        keep = es[i] - now
      end
    end
  end
  return table.concat(parts), keep
end

-- The decision on parsed entries (in_flight_live's, or a release's or renewal's
-- result, where an entry may count 0 and then counts as absent). `peek`: nothing
-- will be written (a peek, or the answer after a release or a renewal), so the next
-- state is not built.
local function in_flight_on(limit, ttl, now, holder, hs, cs, es, peek)
  local count, mine = 0, nil
  for i = 1, #hs do
    if cs[i] > 0 then
      count = count + cs[i]
      if hs[i] == holder and not mine then
        mine = i
      end
    end
  end
  if count >= limit then
    -- The soonest a slot would free itself if no request ended before: a hint.
    local soonest, keep = IN_FLIGHT_RETRY_HINT, 0
    for i = 1, #es do
      if cs[i] > 0 then
        local left = es[i] - now
        if left < soonest then
          soonest = left
        end
        if left > keep then
          keep = left
        end
      end
    end
    if soonest < 1 then
      soonest = 1
    end
    return false, 0, keep, soonest, 0, nil
  end
  if peek then
    local keep = ttl
    for i = 1, #es do
      if i ~= mine and cs[i] > 0 and es[i] - now > keep then
        keep = es[i] - now
      end
    end
    return true, limit - count - 1, keep, 0, keep, nil
  end
  if mine then
    cs[mine], es[mine] = cs[mine] + 1, now + ttl
  else
    local n = #hs + 1
    hs[n], cs[n], es[n] = holder, 1, now + ttl
  end
  local nxt, keep = in_flight_state(hs, cs, es, now)
  return true, limit - count - 1, keep, 0, keep, nxt
end

local function in_flight(limit, ttl, now, holder, raw, peek)
  local hs, cs, es = in_flight_live(raw, now, ttl)
  return in_flight_on(limit, ttl, now, holder, hs, cs, es, peek)
end

DECIDE[ALG_IN_FLIGHT] = in_flight
