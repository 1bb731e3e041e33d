-- redlimit: operations on subjects' policies, one after the other in one call: a
-- lone check is a batch of one. Each operation (a record) is decided as its own
-- call would be (a check all or nothing across its own policies), in the order
-- given, on what the records before it left: a subject named twice is decided
-- twice, the second time on what the first changed. A denial never touches another
-- record: the batch is not all or nothing across records. Every key is read once
-- (one MGET), every state parsed once, and each key a record changed written once,
-- at the end.
--
-- The layout is src/store/redis/contract's (its constants by name, see common.lua):
-- ARGV[1]   the head, three bytes, then the first set's definition: the clock
--           (HEAD_REDIS_CLOCK: every record is
--           decided at one Redis TIME, read once; HEAD_CLIENT_CLOCK: each record
--           carries the client's clock in ms), the flags over FLAGS_BASE (FLAG_MAP: each record names
--           its keys' slots; FLAG_OPS: each record starts with its operation's
--           letter, else every record is a check; FLAG_COSTS: a cost per record
--           follows, else every record costs 1), and the number of policy sets s
-- ARGV[2 .. s] the other policy sets' definitions (decide.lua)
-- ARGV[s+1] the records: [op letter] set (a byte, from 1) [a key slot byte per
--           policy of the set]; without FLAG_MAP, a record's keys are the next ones
--           in KEYS, one per policy of its set. Empty, with one set and neither
--           FLAG_MAP nor FLAG_OPS: checks of that set, as many as the keys make;
--           left out (and with it costs and times) when they are so on Redis TIME
-- then      with FLAG_COSTS, a cost per record (a release's and a renewal's: the
--           slots its holder holds); then with HEAD_CLIENT_CLOCK, a time per record
-- KEYS      the keys the records name
--
-- Every set, record, cost, time and key is checked before anything is written.
-- Reply: each record's policies' outcomes (common.lua's put), record after record,
-- packed into one string (common.lua's packed); a lone check of one policy whose
-- outcome is one integer gets that integer alone.

if not call then
  init()
end
CALL, CALL_KEYS = CALL + 1, KEYS
local nargs, nkeys = #ARGV, #KEYS
local first = ARGV[1] or ""
local clock, flags, nsets = byte(first, 1, 3)
if nargs == 1 and flags == FLAGS_BASE and nsets == 1 and clock == HEAD_REDIS_CLOCK then
  -- The common call: checks of one set at cost 1 on Redis TIME, each naming its own
  -- keys, in order (a lone check among them).
  local set, bad = read_set(first, 4)
  if not set then
    return redis.error_reply(bad)
  end
  local p = set.keys
  if nkeys == 0 or nkeys % p ~= 0 then
    return redis.error_reply(fmt("ERR redlimit: checks of %d policies each take their keys, got %d", set.n, nkeys))
  end
  local now = time_ms()
  if nkeys == 1 then
    -- One check of one policy: its outcome alone, one integer when it packs into
    -- one (the cheapest reply there is), and no new table.
    -- GET fails on a key of another type, which MGET reads as absent: as absent here
    -- too (its error comes back as a table; a string's .err is nil). Any other error
    -- is the call's, as redis.call would have made it.
    local raw = try_call("GET", KEYS[1])
    if raw and raw.err then
      if find(raw.err, "WRONGTYPE", 1, true) ~= 1 then
        return raw
      end
      raw = false
    end
    ONE_RAW[1] = raw
    local r = check_once(set, 0, 1, now, ONE_REPLY, 0, ONE_RAW, KEYS, true)
    if r == 1 then
      return ONE_REPLY[1]
    end
    return packed(ONE_REPLY, r)
  end
  -- Every state in one read. The reply sized for a few checks (a table grown from
  -- empty is rebuilt at 1, 2, 4 and 8 items); its first r items are the reply.
  local raws, reply, r = call("MGET", unpacked(KEYS)), { nil, nil, nil, nil, nil, nil, nil, nil }, 0
  if set.joint then
    -- check_once's dispatch, once for the call: a joint set's key a check.
    for k = 1, nkeys do
      r = check_joint(set, 1, now, reply, r, raws[k], KEYS[k], true)
    end
  else
    for k0 = 0, nkeys - p, p do
      r = check_once(set, k0, 1, now, reply, r, raws, KEYS, true)
    end
  end
  return packed(reply, r)
end
local timed = clock == HEAD_CLIENT_CLOCK
if not (nsets and nsets >= 1 and (timed or clock == HEAD_REDIS_CLOCK) and flags >= FLAGS_BASE
    and flags < FLAGS_BASE + 8 and nargs >= nsets) then
  return redis.error_reply("ERR redlimit: a batch starts with its head (clock, flags, number of policy sets) and its sets")
end
local map, ops, costs = false, false, false
if flags ~= FLAGS_BASE then
  map, ops, costs = flags % 2 >= 1, flags % 4 >= 2, flags % 8 >= 4
end
-- One set: a table the library keeps (a script makes it anew), since no record can
-- name a set past the first.
local sets = nsets == 1 and ONE_SET or {}
for s = 1, nsets do
  local set, bad
  if s == 1 then
    set, bad = read_set(first, 4)
  else
    set, bad = read_set(ARGV[s], 1)
  end
  if not set then
    return redis.error_reply(bad)
  end
  sets[s] = set
end
-- No records argument: as an empty one, every record costing 1 on Redis TIME.
local records = ARGV[nsets + 1] or ""
local size = #records
-- The costs and times follow the records, as many of each as there are records.
local per = (costs and 1 or 0) + (timed and 1 or 0)
local n = per > 0 and (nargs - nsets - 1) / per or 0
local costs_at = 2 + nsets
local times_at = costs and costs_at + n or costs_at
if (per == 0 and nargs ~= nsets + 1 and not (nargs == nsets and size == 0))
    or (per > 0 and (n < 1 or n ~= floor(n))) then
  return redis.error_reply(fmt("ERR redlimit: a batch of %d sets takes its records, then as many costs and times as records, got %d arguments", nsets, nargs))
end
-- A record's cost and clock, from the arguments (or 1 and Redis TIME), and whether
-- they are numbers.
local now = not timed and time_ms() or nil
local function cost_and_time(j)
  local cost, at = 1, now
  if costs then
    cost = tonum(ARGV[costs_at + j])
  end
  if timed then
    at = tonum(ARGV[times_at + j])
  end
  return cost, at, cost and at
end
local bad_record = "ERR redlimit: record %d of the batch %s"
if size == 0 then
  -- No records: checks of the one set, as many as the keys make, each naming its own
  -- keys: written at once, so every cost and time is checked first.
  local set = sets[1]
  local p = set.keys
  if nsets ~= 1 or map or ops or nkeys % p ~= 0 or (per > 0 and n ~= nkeys / p) then
    return redis.error_reply("ERR redlimit: a batch without records has one set, no operations or slots, and as many keys as its checks take")
  end
  n = nkeys / p
  for j = 0, n - 1 do
    local _, _, fine = cost_and_time(j)
    if not fine then
      return redis.error_reply(fmt(bad_record, j + 1, "has no cost or clock"))
    end
  end
  local raws, reply, r = call("MGET", unpacked(KEYS)), { nil, nil, nil, nil, nil, nil, nil, nil }, 0
  for j = 0, n - 1 do
    local cost, at = cost_and_time(j)
    r = check_once(set, j * p, cost, at, reply, r, raws, KEYS, not timed)
  end
  return packed(reply, r)
end
-- The records' bytes, read out once (string.byte is a call a byte).
local rec = { byte(records, 1, size) }
if not map then
  -- Records each naming its own keys: a check's written at once (check_once), any
  -- other operation's as soon as it ran, so every record is checked first.
  local needed, j, pos = 0, 0, 1
  while pos <= size do
    if ops then
      if not OP_OF[rec[pos]] then
        return redis.error_reply(fmt(bad_record, j + 1, fmt("has no operation of the batch's (%q)", char(rec[pos]))))
      end
      pos = pos + 1
    end
    local set = sets[rec[pos] or 0]
    local fine = true
    if per > 0 then
      local _
      _, _, fine = cost_and_time(j)
    end
    if not (set and fine) then
      return redis.error_reply(fmt(bad_record, j + 1, "names no set, or has no cost or clock"))
    end
    needed, j, pos = needed + set.keys, j + 1, pos + 1
  end
  if needed ~= nkeys or (per > 0 and j ~= n) then
    return redis.error_reply(fmt("ERR redlimit: the batch's records (%d) take %d keys, got %d", j, needed, nkeys))
  end
  local raws, reply, r, k0 = call("MGET", unpacked(KEYS)), { nil, nil, nil, nil, nil, nil, nil, nil }, 0, 0
  pos = 1
  for i = 0, j - 1 do
    local op = OP_CHECK
    if ops then
      op = OP_OF[rec[pos]]
      pos = pos + 1
    end
    local set = sets[rec[pos]]
    local cost, at = 1, now
    if per > 0 then
      cost, at = cost_and_time(i)
    end
    local p = set.keys
    if op == OP_CHECK then
      r = check_once(set, k0, cost, at, reply, r, raws, KEYS, not timed)
    else
      r = run(op, set, nil, k0, cost, at, reply, r, raws, not timed)
      write_all(KEYS, k0 + 1, k0 + p)
    end
    k0, pos = k0 + p, pos + 1
  end
  return packed(reply, r)
end
-- Records that name their keys' slots or their operations: decided on the states
-- read once, each key written once at the end, so a record found wrong on the way
-- leaves nothing written.
if not A then
  scratch()
end
local raws, reply, r, k0 = call("MGET", unpacked(KEYS)), { nil, nil, nil, nil, nil, nil, nil, nil }, 0, 0
local pos, j, keeps = 1, 0, not timed
while pos <= size do
  local op = OP_CHECK
  if ops then
    op = OP_OF[rec[pos]]
    if not op then
      return redis.error_reply(fmt(bad_record, j + 1, fmt("has no operation of the batch's (%q)", char(rec[pos]))))
    end
    pos = pos + 1
  end
  local set = sets[rec[pos] or 0]
  local cost, at, fine = 1, now, true
  if per > 0 then
    cost, at, fine = cost_and_time(j)
  end
  if not (set and fine) then
    return redis.error_reply(fmt(bad_record, j + 1, "names no set, or has no cost or clock"))
  end
  local p = set.keys
  if map then
    for i = 1, p do
      local k = rec[pos + i]
      if not k or k < 1 or k > nkeys then
        return redis.error_reply(fmt(bad_record, j + 1, "names a key it has not"))
      end
    end
    if set.n == 1 and op == OP_CHECK then
      r = check_slot(set, rec[pos + 1], cost, at, reply, r, raws, keeps)
    else
      r = run(op, set, rec, pos + 1, cost, at, reply, r, raws, keeps)
    end
  else
    r = run(op, set, nil, k0, cost, at, reply, r, raws, keeps)
  end
  pos, k0, j = pos + 1 + (map and p or 0), k0 + p, j + 1
end
if (per > 0 and j ~= n) or (not map and k0 ~= nkeys) then
  return redis.error_reply(fmt("ERR redlimit: the batch's records (%d) take %d keys and their costs and times, got %d keys and %d arguments", j, map and nkeys or k0, nkeys, nargs))
end
write_all(KEYS, 1, nkeys)
return packed(reply, r)
