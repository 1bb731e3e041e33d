-- redlimit: the lease rule of a leasing check (OP_LEASE), composed after
-- decide.lua only into what leases (the leasing check's scripts, the library).
-- Translation of decide_leasing in src/algorithm/mod.rs (see src/lease).

-- The longest wait, over the enforced policies of the set, until the cost and
-- `batch` more fit. (The crate keeps cost + batch within what every enforced
-- policy admits at once.)
local function lease_wait(set, n, raws, now, asked)
  local longest = 0
  for i = 1, n do
    local b = SET_FIELDS * (i - 1)
    if not set[b + SET_SHADOW] then
      local _, _, _, retry = set[b + SET_DECIDE](set[b + SET_LIMIT], set[b + SET_WINDOW], now, asked, raws[i])
      if retry > longest then
        longest = retry
      end
    end
  end
  return longest
end

-- On what decide_policies made of the set's policies (`all`, the reply and the
-- writes) from the states it read (raws): a lease of up to `want` units beyond
-- the cost, taken from every policy, at most what each admits now and at least
-- `batch`; none while a shadow policy would deny (the cost alone, so shadow
-- reports stay those of checks). Fewer than a batch beyond the cost denies the
-- check, nothing written, until the cost and a batch fit: a unit at a time would
-- cost a call a unit. Writes the LEASE_FIELDS integers after the policies'
-- (main.lua), and the lease generation at lease_key: made by the first grant,
-- kept as long as the states this grant writes (give-backs apply only while it
-- stands). Returns whether the check admits.
local function lease(set, raws, reply, writes, now, cost, want, batch, all, lease_key)
  local n = #set / SET_FIELDS
  local grant, window_left, again = 0, 0, 0
  if all then
    local room, shadow_denies = want, false
    for i = 1, n do
      local base = REPLY_FIELDS * (i - 1)
      if reply[base + REPLY_ALLOWED] == 0 then
        shadow_denies = true
      elseif reply[base + REPLY_REMAINING] < room then
        room = reply[base + REPLY_REMAINING]
      end
    end
    if shadow_denies then
      room = 0
    elseif room >= batch then
      grant = room
    else
      again = lease_wait(set, n, raws, now, cost + batch)
      all = false
      for i = 1, n do
        if not set[SET_FIELDS * (i - 1) + SET_SHADOW] then
          local base = REPLY_FIELDS * (i - 1)
          reply[base + REPLY_ALLOWED] = 0
          reply[base + REPLY_REMAINING] = 0
          reply[base + REPLY_RETRY] = again
        end
      end
    end
    for i = 1, n do
      local b = SET_FIELDS * (i - 1)
      local w = set[b + SET_WINDOW]
      if grant > 0 then
        -- The same decision for cost + grant: admitted, since grant fits every policy.
        local _, remaining, reset, _, ttl, nxt = set[b + SET_DECIDE](set[b + SET_LIMIT], w, now, cost + grant, raws[i])
        local base = REPLY_FIELDS * (i - 1)
        reply[base + REPLY_REMAINING] = remaining
        reply[base + REPLY_RESET] = reset
        writes[i] = nxt
        writes[n + i] = ttl
      end
      local code = set[b + SET_CODE]
      local left = 0
      if code == ALG_FIXED_WINDOW or code == ALG_SLIDING_WINDOW then
        left = w - now % w
      elseif code == ALG_CALENDAR then
        -- w is the period's end; past it, the period's last millisecond.
        left = math.max(w - now, 1)
      end
      if left > 0 and (window_left == 0 or left < window_left) then
        window_left = left
      end
    end
  elseif batch > 0 then
    again = lease_wait(set, n, raws, now, cost + batch)
  end
  local epoch = 0
  if grant > 0 then
    local current = redis.call("GET", lease_key)
    if not current then
      local t = redis.call("TIME")
      current = t[1] .. string.format("%06d", tonumber(t[2]))
    end
    local keep = 1
    for i = 1, n do
      if writes[i] and writes[n + i] > keep then
        keep = writes[n + i]
      end
    end
    redis.call("SET", lease_key, current, "PX", int(keep))
    epoch = tonumber(current)
  end
  local tail = REPLY_FIELDS * n
  reply[tail + LEASE_GRANT] = grant
  reply[tail + LEASE_WINDOW_LEFT] = window_left
  reply[tail + LEASE_AGAIN] = again
  reply[tail + LEASE_WINDOW_END] = window_left > 0 and now + window_left or 0
  reply[tail + LEASE_EPOCH] = epoch
  return all
end
