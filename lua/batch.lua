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
-- Reply: each record's policies' outcomes (common.lua's put), record after record;
-- a lone check of one policy whose outcome is one integer gets that integer alone.

if not call then
  init()
end
CALL = CALL + 1
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
  local p = set.n
  if nkeys == 0 or nkeys % p ~= 0 then
    return redis.error_reply(fmt("ERR redlimit: checks of %d policies each take their keys, got %d", p, nkeys))
  end
  local now = time_ms()
  if nkeys == 1 then
    -- One check of one policy: its outcome alone, one integer when it packs into
    -- one (Redis turns a table into a reply at a cost of its own), and no new table.
    ONE_RAW[1] = call("GET", KEYS[1])
    local r = check_once(set, 0, 1, now, ONE_REPLY, 0, ONE_RAW, KEYS, true)
    if r == 1 then
      return ONE_REPLY[1]
    end
    return { unpacked(ONE_REPLY, 1, r) }
  end
  -- Every state in one read. The reply sized for a few checks (a table grown from
  -- empty is rebuilt at 1, 2, 4 and 8 items); Redis reads it up to its first nil.
  local raws, reply, r = call("MGET", unpacked(KEYS)), { nil, nil, nil, nil, nil, nil, nil, nil }, 0
  for k0 = 0, nkeys - p, p do
    r = check_once(set, k0, 1, now, reply, r, raws, KEYS, true)
  end
  return reply
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
local size, pos, n, needed = #records, 1, 0, 0
if size == 0 then
  -- No records: checks of the one set, as many as the keys make.
  local p = sets[1].n
  if nsets ~= 1 or map or ops or nkeys % p ~= 0 then
    return redis.error_reply("ERR redlimit: a batch without records has one set, no operations or slots, and its keys")
  end
  n, needed = nkeys / p, nkeys
end
while pos <= size do
  if ops then
    local op = sub(records, pos, pos)
    if not (op == OP_CHECK or op == OP_PEEK or op == OP_REFUND or op == OP_CHARGE or op == OP_RELEASE or op == OP_RENEW) then
      return redis.error_reply(fmt("ERR redlimit: record %d of the batch has no operation of the batch's (%q)", n + 1, op))
    end
    pos = pos + 1
  end
  local set = sets[byte(records, pos) or 0]
  if not set then
    return redis.error_reply(fmt("ERR redlimit: record %d of the batch names no set", n + 1))
  end
  pos = pos + 1
  if map then
    for i = 0, set.n - 1 do
      local k = byte(records, pos + i)
      if not k or k < 1 or k > nkeys then
        return redis.error_reply(fmt("ERR redlimit: record %d of the batch names a key it has not", n + 1))
      end
    end
    pos = pos + set.n
  else
    needed = needed + set.n
  end
  n = n + 1
end
local costs_at = 2 + nsets
local times_at = costs and costs_at + n or costs_at
local args = times_at - 1 + (timed and n or 0)
if map then
  needed = nkeys
end
if nargs == nsets and not (costs or timed) then
  args = nsets
end
if n == 0 or nargs ~= args or needed ~= nkeys then
  return redis.error_reply(fmt(
    "ERR redlimit: the batch's records (%d) take %d keys and %d arguments, got %d and %d",
    n, needed, args, nkeys, nargs))
end
if costs or timed then
  for j = 0, n - 1 do
    if (costs and not tonum(ARGV[costs_at + j])) or (timed and not tonum(ARGV[times_at + j])) then
      return redis.error_reply(fmt("ERR redlimit: record %d of the batch has no cost or clock", j + 1))
    end
  end
end
local now
if not timed then
  now = time_ms()
end
-- Every state in one read.
local raws = call("MGET", unpacked(KEYS))
-- Sized for a few records (a table grown from empty is rebuilt at 1, 2, 4 and 8
-- items); Redis reads a reply up to its first nil.
local reply, r, k0 = { nil, nil, nil, nil, nil, nil, nil, nil }, 0, 0
if size == 0 then
  local set, keeps, cost = sets[1], not timed, 1
  local p = set.n
  for j = 0, n - 1 do
    if costs then
      cost = tonum(ARGV[costs_at + j])
    end
    if timed then
      now = tonum(ARGV[times_at + j])
    end
    r = check_once(set, j * p, cost, now, reply, r, raws, KEYS, keeps)
  end
  return reply
end
pos = 1
for j = 0, n - 1 do
  local op = OP_CHECK
  if ops then
    op = sub(records, pos, pos)
    pos = pos + 1
  end
  local set = sets[byte(records, pos)]
  local cost = 1
  if costs then
    cost = tonum(ARGV[costs_at + j])
  end
  if timed then
    now = tonum(ARGV[times_at + j])
  end
  if map then
    r = run(op, set, records, pos + 1, cost, now, reply, r, raws, not timed)
    pos = pos + 1 + set.n
  elseif ops then
    r = run(op, set, nil, k0, cost, now, reply, r, raws, not timed)
    k0 = k0 + set.n
    pos = pos + 1
  else
    -- Checks of keys no other record names: each written at once.
    r = check_once(set, k0, cost, now, reply, r, raws, KEYS, not timed)
    k0 = k0 + set.n
    pos = pos + 1
  end
end
if map or ops then
  write_all(KEYS, nkeys)
end
return reply
