-- redlimit: decide many checks in one call, each all or nothing across its own
-- subject's policies, in the order given (a subject named twice is decided
-- twice, the second time on what the first wrote). A check's denial never
-- touches another check: the batch is not all or nothing across checks.
--
-- The layout is src/store/redis/contract's (its constants by name, see common.lua):
-- ARGV[BATCH_MODE]   BATCH_REDIS_CLOCK: the checks are decided at one Redis
--           TIME, read once; BATCH_CLIENT_CLOCK: each check carries the
--           client's clock in ms; either followed by BATCH_REPEATS when a
--           subject comes more than once in the batch
-- ARGV[BATCH_SETS]   the number of policy sets s, then each set: its number of
--           policies p, then POLICY_ARGS p arguments (algorithm, limit,
--           window or interval: as in main.lua)
-- then      one byte per check: its set, 1 for the first (so a batch has at
--           most 255 sets; its length is the number of checks n)
-- then      BATCH_UNIT_COSTS when every check costs 1, else BATCH_COSTS and
--           n costs
-- then      with BATCH_CLIENT_CLOCK, n times in ms
-- KEYS      each check's keys, one per policy of its set, check after check
--
-- A check's set and cost are read without tonumber where they can be, and
-- every argument Redis turns into a Lua string costs a call a visible share.
--
-- Reply: each check's REPLY_FIELDS integers per policy (as main.lua's), check
-- after check.

local mode = ARGV[BATCH_MODE]
local clock, rest = string.sub(mode, 1, 1), string.sub(mode, 2)
local timed, repeats = clock == BATCH_CLIENT_CLOCK, rest == BATCH_REPEATS
local nsets = tonumber(ARGV[BATCH_SETS])
if not (nsets and (timed or clock == BATCH_REDIS_CLOCK) and (repeats or rest == "")) then
  return redis.error_reply(string.format(
    "ERR redlimit: a batch starts with its clock (%s or %s) and its number of policy sets",
    BATCH_REDIS_CLOCK, BATCH_CLIENT_CLOCK))
end
local sets = {}
local at = BATCH_SETS + 1
for s = 1, nsets do
  local p = tonumber(ARGV[at])
  if not p then
    return redis.error_reply(string.format("ERR redlimit: policy set %d has no size", s))
  end
  local set, bad = read_policies(ARGV, at + 1, p)
  if not set then
    return redis.error_reply(bad)
  end
  sets[s] = set
  at = at + 1 + POLICY_ARGS * p
end
-- Every set's policies (above), every check's set, cost and time and the keys
-- they name: all read and checked before any check writes.
local order, unit = ARGV[at], ARGV[at + 1]
local n = order and #order or 0
local costs_at = at + 2
local times_at = unit == BATCH_UNIT_COSTS and costs_at or costs_at + n
if not (unit == BATCH_UNIT_COSTS or unit == BATCH_COSTS) or #ARGV ~= times_at - 1 + (timed and n or 0) then
  return redis.error_reply("ERR redlimit: a batch's checks take a set each, then their costs (and times)")
end
local needed = 0
for j = 1, n do
  local set = sets[string.byte(order, j)]
  local cost = 1
  if unit == BATCH_COSTS then
    cost = tonumber(ARGV[costs_at + j - 1])
  end
  local t = timed and tonumber(ARGV[times_at + j - 1])
  if not (set and cost and (t or not timed)) then
    return redis.error_reply(string.format(
      "ERR redlimit: check %d of the batch names no set, or has no cost or clock", j))
  end
  needed = needed + #set / SET_FIELDS
end
if needed ~= #KEYS then
  return redis.error_reply(string.format(
    "ERR redlimit: the batch's checks name %d keys, got %d", needed, #KEYS))
end
local now
if not timed then
  now = time_ms()
end
-- Every state the batch reads, in one call; what its checks write is kept for
-- the checks after them and written once at the end.
local batch = new_batch(redis.call("MGET", unpack(KEYS)), repeats)
local reply, writes = {}, { false, false }
local k0 = 0
for j = 1, n do
  -- Read again rather than kept in tables: a set is a byte away, and a cost
  -- other than 1 and a client's time are the rare batches.
  local set, cost = sets[string.byte(order, j)], 1
  if unit == BATCH_COSTS then
    cost = tonumber(ARGV[costs_at + j - 1])
  end
  if timed then
    now = tonumber(ARGV[times_at + j - 1])
  end
  if decide_policies(KEYS, k0, set, OP_CHECK, now, cost, reply, REPLY_FIELDS * k0, writes, nil, batch) then
    write_states(KEYS, k0, #set / SET_FIELDS, writes, batch)
  end
  k0 = k0 + #set / SET_FIELDS
end
write_batch(batch)
return reply
