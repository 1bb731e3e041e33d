-- redlimit: decide many checks in one call, each all or nothing across its own
-- subject's policies, in the order given (a subject named twice is decided
-- twice, the second time on what the first wrote). A check's denial never
-- touches another check: the batch is not all or nothing across checks.
--
-- ARGV[1]   "t": the checks are decided at one Redis TIME, read once;
--           "c": each check carries the client's clock in ms; either
--           followed by "r" when a subject comes more than once in the batch
-- ARGV[2]   the number of policy sets s, then each set: its number of
--           policies p, then 3p arguments (algorithm, limit, window or
--           interval: as in main.lua)
-- then      one byte per check: its set, 1 for the first (so a batch has at
--           most 255 sets; its length is the number of checks n)
-- then      "1" when every check costs 1, else "n" and n costs
-- then      with "c", n times in ms
-- KEYS      each check's keys, one per policy of its set, check after check
--
-- A check's set and cost are read without tonumber where they can be, and
-- every argument Redis turns into a Lua string costs a call a visible share.
--
-- Reply: each check's four integers per policy (as main.lua's), check after
-- check.

local mode = ARGV[1]
local timed, repeats = string.sub(mode, 1, 1) == "c", string.sub(mode, 2) == "r"
local nsets = tonumber(ARGV[2])
if not (nsets and (mode == "t" or mode == "c" or mode == "tr" or mode == "cr")) then
  return redis.error_reply("ERR redlimit: a batch starts with its clock (t or c) and its number of policy sets")
end
local sets = {}
local at = 3
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
  at = at + 1 + 3 * p
end
-- Every set's policies (above), every check's set, cost and time and the keys
-- they name: all read and checked before any check writes.
local order, unit = ARGV[at], ARGV[at + 1]
local n = order and #order or 0
local costs_at = at + 2
local times_at = unit == "1" and costs_at or costs_at + n
if not (unit == "1" or unit == "n") or #ARGV ~= times_at - 1 + (timed and n or 0) then
  return redis.error_reply("ERR redlimit: a batch's checks take a set each, then their costs (and times)")
end
local needed = 0
for j = 1, n do
  local set = sets[string.byte(order, j)]
  local cost = 1
  if unit == "n" then
    cost = tonumber(ARGV[costs_at + j - 1])
  end
  local t = timed and tonumber(ARGV[times_at + j - 1])
  if not (set and cost and (t or not timed)) then
    return redis.error_reply(string.format(
      "ERR redlimit: check %d of the batch names no set, or has no cost or clock", j))
  end
  needed = needed + #set / 5
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
  if unit == "n" then
    cost = tonumber(ARGV[costs_at + j - 1])
  end
  if timed then
    now = tonumber(ARGV[times_at + j - 1])
  end
  if decide_policies(KEYS, k0, set, "c", now, cost, reply, 4 * k0, writes, nil, batch) then
    write_states(KEYS, k0, #set / 5, writes, batch)
  end
  k0 = k0 + #set / 5
end
write_batch(batch)
return reply
