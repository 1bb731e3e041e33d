-- Sliding log: the last `limit` admitted stamps, exact in every window.
-- Translation of decide in src/algorithm/sliding_log.rs.
--
-- State: ONE string, a 4-byte big-endian header (the ring slot of the oldest
-- stamp) then n stamps of 6 bytes each (big-endian milliseconds, good for
-- 8900 years), n <= limit. Logical stamp i (0 = oldest) lives in slot
-- (head + i) % n: while the ring fills, head is 0 and the stamps are in order;
-- once full (n = limit) each admission overwrites the oldest slots. At limit
-- 1000 that is 6004 bytes, where a sorted set costs about 90 KB. The algorithm
-- works on the string itself (READ checks its shape); its newest stamp goes beside
-- it, for the TTL.
local SL_HEAD = 4
local SL_STAMP = 6

local function sliding_log_read(raw)
  if raw then
    local len = #raw
    if len >= SL_HEAD + SL_STAMP and (len - SL_HEAD) % SL_STAMP == 0
      and sunpack(">I4", raw) < (len - SL_HEAD) / SL_STAMP then
      return raw, nil, nil, false
    end
  end
  return nil
end

-- The ring in `raw` as a decision reads it: its slot count n, head, the first
-- logical stamp that counts (base), how many count (len), the logical stamp i (0 =
-- oldest), and the time a decision takes: a clock that went back is clamped to the
-- newest stamp, so stamps stay sorted. A newest stamp more than MAX_BACK windows
-- ahead is no clock that went back but state this clock cannot have written: read
-- as empty (replaced when admitting). Shared by the check, the refund and the charge.
local function sl_read(raw, limit, w, now)
  local n, head = 0, 0
  if raw then
    n = (#raw - SL_HEAD) / SL_STAMP
    head = sunpack(">I4", raw)
  end
  -- A log kept under a larger limit (the policy changed): only its newest
  -- `limit` stamps count.
  local base = 0
  if n > limit then
    base = n - limit
  end
  local function stamp(i)
    local slot = (head + base + i) % n
    return (sunpack(">I6", raw, SL_HEAD + 1 + slot * SL_STAMP))
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
  local stop = min(first_slot + run, n)
  local out = sub(raw, SL_HEAD + 1 + first_slot * SL_STAMP, SL_HEAD + stop * SL_STAMP)
  local wrapped = first_slot + run - stop
  if wrapped > 0 then
    out = out .. sub(raw, SL_HEAD + 1, SL_HEAD + wrapped * SL_STAMP)
  end
  return out
end

local function sliding_log_step(limit, w, now, cost, raw, _, _, peek)
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
  local nxt = raw
  if allowed then
    -- The oldest `drop` stamps make room for `cost` new ones.
    local drop = max(len + cost - limit, 0)
    count = cost + len - max(drop, lo)
    newest = now
    if not peek then
      local fresh = pack(">I6", now)
      if n == limit then
        -- A full ring: the oldest slots take the new stamps, the head moves on.
        local first = min(cost, limit - head)
        local wrapped = cost - first
        nxt = pack(">I4", (head + cost) % limit) .. rep(fresh, wrapped)
          .. sub(raw, SL_HEAD + 1 + wrapped * SL_STAMP, SL_HEAD + head * SL_STAMP)
          .. rep(fresh, first) .. sub(raw, SL_HEAD + 1 + (head + first) * SL_STAMP)
      else
        -- Growing, or a ring of another size: rewritten in order, head 0.
        nxt = pack(">I4", 0) .. sl_copy(raw, n, head, base, drop, len - drop) .. rep(fresh, cost)
      end
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
    reset = max(newest + w - asked, 0)
  end
  local retry = 0
  if not allowed then
    retry = deciding + w - asked
  end
  return allowed, max(limit - count, 0), reset, retry, nxt, newest
end

-- Kept until the newest stamp leaves the window (a refund's log, which only
-- shrank, keeps its TTL: it has no newest stamp beside it).
local function sliding_log_encode(w, now, raw, newest, _, keep)
  if keep == true then
    return raw, 0, true
  end
  return raw, newest + w - now, false
end

READ[ALG_SLIDING_LOG], STEP[ALG_SLIDING_LOG], ENCODE[ALG_SLIDING_LOG] =
  sliding_log_read, sliding_log_step, sliding_log_encode
