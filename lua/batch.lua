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
-- ARGV[1]   the head, three bytes: the clock (HEAD_REDIS_CLOCK: every record is
--           decided at one Redis TIME, read once; HEAD_CLIENT_CLOCK: each record
--           carries the client's clock in ms), the flags over FLAGS_BASE (FLAG_MAP: each record names
--           its keys' slots; FLAG_OPS: each record starts with its operation's
--           letter, else every record is a check; FLAG_COSTS: a cost per record
--           follows, else every record costs 1), and the number of policy sets s
-- ARGV[2 .. s+1] the policy sets' definitions (decide.lua)
-- ARGV[s+2] the records: [op letter] set (a byte, from 1) [a key slot byte per
--           policy of the set]; without FLAG_MAP, a record's keys are the next ones
--           in KEYS, one per policy of its set. Empty, with one set and neither
--           FLAG_MAP nor FLAG_OPS: checks of that set, as many as the keys make
-- then      with FLAG_COSTS, a cost per record (a release's and a renewal's: the
--           slots its holder holds); then with HEAD_CLIENT_CLOCK, a time per record
-- KEYS      the keys the records name
--
-- Every set, record, cost, time and key is checked before anything is written.
-- Reply: each record's policies' outcomes (common.lua's put), record after record.

if not call then
  init()
end
CALL = CALL + 1
local nargs, nkeys = #ARGV, #KEYS
local clock, flags, nsets = byte(ARGV[1] or "", 1, 3)
local timed = clock == HEAD_CLIENT_CLOCK
if not (nsets and nsets >= 1 and (timed or clock == HEAD_REDIS_CLOCK) and flags >= FLAGS_BASE
    and flags < FLAGS_BASE + 8 and nargs >= nsets + 2) then
  return redis.error_reply("ERR redlimit: a batch starts with its head (clock, flags, number of policy sets), the sets and the records")
end
local map, ops, costs = flags % 2 >= 1, flags % 4 >= 2, flags % 8 >= 4
local sets = {}
for s = 1, nsets do
  local set, bad = read_set(ARGV[1 + s])
  if not set then
    return redis.error_reply(bad)
  end
  sets[s] = set
end
local records = ARGV[2 + nsets]
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
local costs_at = 3 + nsets
local times_at = costs and costs_at + n or costs_at
local args = times_at - 1 + (timed and n or 0)
if map then
  needed = nkeys
end
if n == 0 or nargs ~= args or needed ~= nkeys then
  return redis.error_reply(fmt(
    "ERR redlimit: the batch's records (%d) take %d keys and %d arguments, got %d and %d",
    n, needed, args, nkeys, nargs))
end
for j = 0, n - 1 do
  if (costs and not tonum(ARGV[costs_at + j])) or (timed and not tonum(ARGV[times_at + j])) then
    return redis.error_reply(fmt("ERR redlimit: record %d of the batch has no cost or clock", j + 1))
  end
end
local now
if not timed then
  now = time_ms()
end
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
