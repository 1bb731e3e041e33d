-- redlimit: a leasing check (OP_LEASE), composed after decide.lua only into what
-- leases (the leasing check's scripts, the library). Translation of
-- decide_leasing in src/algorithm/mod.rs (see src/lease).

-- The longest wait, over the enforced policies of the set (states at SLOT[i], as load left them),
-- until `asked` fits. (The crate keeps cost + batch within what every enforced
-- policy admits at once.)
local function lease_wait(set, now, asked)
  local longest = 0
  for i = 1, set.n do
    local b = SET_FIELDS * (i - 1)
    if not set[b + SET_SHADOW] then
      local _, _, _, retry = set[b + SET_STEP](set[b + SET_LIMIT], set[b + SET_N], now, asked, A[SLOT[i]], B[SLOT[i]], C[SLOT[i]], true)
      if retry > longest then
        longest = retry
      end
    end
  end
  return longest
end

-- A check of `cost` on one subject's policies (their keys at slots 1..set.keys,
-- read in raws), with a lease of up to `want` units beyond the cost, taken from every
-- policy, at most what each admits now and at least `batch`; none while a shadow
-- policy would deny (the cost alone, so shadow reports stay those of checks).
-- Fewer than a batch beyond the cost denies the check, nothing written, until the
-- cost and a batch fit: a unit at a time would cost a call a unit. Writes each
-- policy's outcome to reply, then the LEASE_FIELDS integers (main.lua), and
-- returns how many the reply holds. Writes the lease generation at keys[n + 1]:
-- made by the first grant, kept as long as the states this grant writes
-- (give-backs apply only while it stands).
local function lease(keys, set, now, cost, want, batch, reply, raws, keeps)
  local n = set.n
  load(set, nil, 0, raws, keeps)
  local all = true
  for i = 1, n do
    local b = SET_FIELDS * (i - 1)
    local arg = set[b + SET_ARG]
    local units = cost
    if arg then
      units = arg == true and 1 or arg
    end
    local allowed, remaining, reset, retry, a, bb, c =
      set[b + SET_STEP](set[b + SET_LIMIT], set[b + SET_N], now, units, A[SLOT[i]], B[SLOT[i]], C[SLOT[i]], false)
    OK[i], NA[i], NB[i], NC[i] = allowed, a, bb, c
    REMAINING[i], RESET[i], RETRY[i] = remaining, reset, retry
    if not allowed and not set[b + SET_SHADOW] then
      all = false
    end
  end
  local grant, window_left, again = 0, 0, 0
  if all then
    local room, shadow_denies = want, false
    for i = 1, n do
      if not OK[i] then
        shadow_denies = true
      elseif REMAINING[i] < room then
        room = REMAINING[i]
      end
    end
    if shadow_denies then
      room = 0
    elseif room >= batch then
      grant = room
    else
      again = lease_wait(set, now, cost + batch)
      all = false
      for i = 1, n do
        if not set[SET_FIELDS * (i - 1) + SET_SHADOW] then
          OK[i], REMAINING[i], RETRY[i] = false, 0, again
        end
      end
    end
    for i = 1, n do
      local b = SET_FIELDS * (i - 1)
      local w = set[b + SET_N]
      if grant > 0 then
        -- The same decision for cost + grant: admitted, since grant fits every policy.
        local _, remaining, reset, _, a, bb, c =
          set[b + SET_STEP](set[b + SET_LIMIT], w, now, cost + grant, A[SLOT[i]], B[SLOT[i]], C[SLOT[i]], false)
        REMAINING[i], RESET[i], NA[i], NB[i], NC[i] = remaining, reset, a, bb, c
      end
      local code = set[b + SET_CODE]
      local left = 0
      if code == ALG_FIXED_WINDOW or code == ALG_SLIDING_WINDOW then
        left = w - now % w
      elseif code == ALG_CALENDAR then
        -- w is the period's end; past it, the period's last millisecond.
        left = max(w - now, 1)
      end
      if left > 0 and (window_left == 0 or left < window_left) then
        window_left = left
      end
    end
  elseif batch > 0 then
    again = lease_wait(set, now, cost + batch)
  end
  local r = 0
  for i = 1, n do
    r = put(reply, r, OK[i], REMAINING[i], RESET[i], RETRY[i])
  end
  local epoch = 0
  if all then
    -- An admission's reset is the time its state is kept.
    local keep = 1
    for i = 1, n do
      if OK[i] then
        local k = SLOT[i]
        A[k], B[k], C[k] = NA[i], NB[i] or false, NC[i] or false
        mark(k, WRITE_CHECK, set, SET_FIELDS * (i - 1), now)
        if RESET[i] > keep then
          keep = RESET[i]
        end
      end
    end
    write_all(keys, 1, set.keys)
    if grant > 0 then
      local lease_key = keys[set.keys + 1]
      local current = call("GET", lease_key)
      if not current then
        local t = call("TIME")
        current = t[1] .. fmt("%06d", tonum(t[2]))
      end
      call("SET", lease_key, current, "PX", int(keep))
      epoch = tonum(current)
    end
  end
  reply[r + LEASE_GRANT] = grant
  reply[r + LEASE_WINDOW_LEFT] = window_left
  reply[r + LEASE_AGAIN] = again
  reply[r + LEASE_WINDOW_END] = window_left > 0 and now + window_left or 0
  reply[r + LEASE_EPOCH] = epoch
  return r + LEASE_FIELDS
end
