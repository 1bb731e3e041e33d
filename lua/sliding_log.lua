-- Sliding log: the last `limit` admitted stamps, exact in every window.
-- Translation of decide in src/algorithm/sliding_log.rs.
--
-- State: ONE string, a 4-byte big-endian header (the ring slot of the oldest
-- stamp) then n stamps of 6 bytes each (big-endian milliseconds, good for
-- 8900 years), n <= limit. Logical stamp i (0 = oldest) lives in slot
-- (head + i) % n: while the ring fills, head is 0 and the stamps are in order;
-- once full (n = limit) each admission overwrites the oldest slots in place.
-- At limit 1000 that is 6004 bytes, where a sorted set costs about 90 KB.
local SL_HEAD = 4
local SL_STAMP = 6

-- The state's reading, shared by the check, the refund and the charge: the ring
-- in `raw` (its slot count n, head, the first logical stamp that counts (base),
-- how many count (len), and the logical stamp i (0 = oldest)), and the time a
-- decision takes: a clock that went back is clamped to the newest stamp, so
-- stamps stay sorted. A newest stamp more than MAX_BACK windows ahead is no clock
-- that went back but state this clock cannot have written: read as empty
-- (replaced when admitting).
local function sl_read(raw, limit, w, now)
  local n, head = 0, 0
  if raw then
    local len = #raw
    if len >= SL_HEAD + SL_STAMP and (len - SL_HEAD) % SL_STAMP == 0 then
      n = (len - SL_HEAD) / SL_STAMP
      head = struct.unpack(">I4", raw)
      if head >= n then
        -- Not a ring this script wrote: start over.
        n, head = 0, 0
      end
    end
  end
  -- A log kept under a larger limit (the policy changed): only its newest
  -- `limit` stamps count.
  local base = 0
  if n > limit then
    base = n - limit
  end
  local function stamp(i)
    local slot = (head + base + i) % n
    return (struct.unpack(">I6", raw, SL_HEAD + 1 + slot * SL_STAMP))
  end
  local len = n - base
  if len > 0 then
    local newest = stamp(len - 1)
    if newest > now + MAX_BACK * w then
      return 0, 0, 0, 0, stamp, now
    end
    if newest > now then
      now = newest
    end
  end
  return n, head, base, len, stamp, now
end

-- The logical stamps [from, from + run) of the ring, in order, as one string.
local function sl_copy(raw, n, head, base, from, run)
  if run <= 0 then
    return ""
  end
  local first_slot = (head + base + from) % n
  local stop = math.min(first_slot + run, n)
  local out = string.sub(raw, SL_HEAD + 1 + first_slot * SL_STAMP, SL_HEAD + stop * SL_STAMP)
  local wrapped = first_slot + run - stop
  if wrapped > 0 then
    out = out .. string.sub(raw, SL_HEAD + 1, SL_HEAD + wrapped * SL_STAMP)
  end
  return out
end

local function sliding_log(limit, w, now, cost, raw)
  local asked = now
  local n, head, base, len, stamp
  n, head, base, len, stamp, now = sl_read(raw, limit, w, now)
  -- Admit iff at most limit - cost stamps are in the window, that is iff the
  -- (limit - cost + 1)-th most recent stamp (if any) has left it.
  local k = limit - cost + 1
  local deciding = nil
  if len >= k then
    deciding = stamp(len - k)
  end
  local allowed = deciding == nil or deciding + w <= now
  -- The first stamp still in the window, by binary search (partition_point);
  -- none to search when the oldest stamp is still in it, the common case.
  local lo, hi = 0, len
  if len > 0 and stamp(0) + w > now then
    hi = 0
  end
  while lo < hi do
    local mid = idiv(lo + hi, 2)
    if stamp(mid) + w <= now then
      lo = mid + 1
    else
      hi = mid
    end
  end
  local count, newest
  local nxt = nil
  if allowed then
    -- The oldest `drop` stamps make room for `cost` new ones.
    local drop = math.max(len + cost - limit, 0)
    count = cost + len - math.max(drop, lo)
    newest = now
    local fresh = string.rep(struct.pack(">I6", now), cost)
    if n == limit then
      -- A full ring: overwrite the oldest slots in place (SETRANGE), at most
      -- two runs; a run that wraps to slot 0 shares one write with the header.
      local first = math.min(cost, limit - head)
      local new_head = (head + cost) % limit
      local header = struct.pack(">I4", new_head)
      nxt = { SL_HEAD + head * SL_STAMP, string.sub(fresh, 1, first * SL_STAMP) }
      table.insert(nxt, 0)
      table.insert(nxt, header .. string.sub(fresh, first * SL_STAMP + 1))
    else
      -- Growing, or a ring of another size: rewrite it in order, head 0.
      nxt = struct.pack(">I4", 0) .. sl_copy(raw, n, head, base, drop, len - drop) .. fresh
    end
  else
    count = len - lo
    if len > 0 then
      newest = stamp(len - 1)
    end
  end
  -- Waits are counted from the time asked: a clamped clock waits for the newest
  -- stamp too.
  local reset = 0
  if newest then
    reset = math.max(newest + w - asked, 0)
  end
  local retry = 0
  if not allowed then
    retry = deciding + w - asked
  end
  return allowed, math.max(limit - count, 0), reset, retry, reset, nxt
end

DECIDE[ALG_SLIDING_LOG] = sliding_log
