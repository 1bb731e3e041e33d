-- redlimit: decide many checks in one call, each all or nothing across its own
-- subject's policies, in the order given (a subject named twice is decided
-- twice, the second time on what the first wrote). A check's denial never
-- touches another check: the batch is not all or nothing across checks.
--
-- ARGV[1]   "t": the checks are decided at one Redis TIME, read once;
--           "c": each check carries the client's clock in ms
-- ARGV[2]   the number of policy sets s, then each set: its number of
--           policies p, then 3p arguments (algorithm, limit, window or
--           interval: as in main.lua)
-- then each check: the number of its set (1..s), its cost, and with "c" its
--           time in ms
-- KEYS      each check's keys, one per policy of its set, check after check
--
-- Reply: each check's four integers per policy (as main.lua's), check after
-- check.

local timed = ARGV[1] == "c"
local stride = timed and 3 or 2
local nsets = tonumber(ARGV[2])
if not (nsets and (timed or ARGV[1] == "t")) then
  return redis.error_reply("ERR redlimit: a batch starts with its clock (t or c) and its number of policy sets")
end
local set_size, set_at = {}, {}
local at = 3
for s = 1, nsets do
  local p = tonumber(ARGV[at])
  if not p then
    return redis.error_reply(string.format("ERR redlimit: policy set %d has no size", s))
  end
  set_size[s], set_at[s] = p, at + 1
  for i = 1, p do
    local a = at + 3 * i - 2
    if not (DECIDE[ARGV[a]] and tonumber(ARGV[a + 1]) and tonumber(ARGV[a + 2])) then
      return redis.error_reply(bad_policy(i, ARGV[a], ARGV[a + 1], ARGV[a + 2]))
    end
  end
  at = at + 1 + 3 * p
end
-- Every set's policies (above), every check's set and the keys they name: all
-- checked before any check writes.
local nargs, needed = #ARGV, 0
if (nargs - at + 1) % stride ~= 0 then
  return redis.error_reply("ERR redlimit: a batch's checks take a set and a cost (and a clock) each")
end
for c = at, nargs, stride do
  local p = set_size[tonumber(ARGV[c])]
  if not (p and tonumber(ARGV[c + 1]) and (not timed or tonumber(ARGV[c + 2]))) then
    return redis.error_reply(string.format(
      "ERR redlimit: check %d of the batch names no set, or has no cost or clock", (c - at) / stride + 1))
  end
  needed = needed + p
end
if needed ~= #KEYS then
  return redis.error_reply(string.format(
    "ERR redlimit: the batch's checks name %d keys, got %d", needed, #KEYS))
end
local now
if not timed then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000 + idiv(tonumber(t[2]), 1000)
end
local reply, writes = {}, { false, false }
local k0 = 0
for c = at, nargs, stride do
  local s = tonumber(ARGV[c])
  local p = set_size[s]
  if timed then
    now = tonumber(ARGV[c + 2])
  end
  local all, bad = decide_policies(KEYS, k0, p, ARGV, set_at[s], "c", now, tonumber(ARGV[c + 1]), reply, 4 * k0, writes, nil)
  if all == nil then
    return redis.error_reply(bad)
  end
  if all then
    write_states(KEYS, k0, p, writes)
  end
  k0 = k0 + p
end
return reply
