-- redlimit: one operation on one subject that needs its lease generation key: a
-- reset (OP_RESET), a leasing check (OP_LEASE), a lease's give-back
-- (OP_GIVE_BACK). src/store/redis/script.rs wraps this file in each entry point,
-- `op` being its operation. The layout is src/store/redis/contract's:
--
-- KEYS  each policy's state key, in the set's order, then the subject's lease
--       generation key
-- ARGV  ARG_SET the policy set's definition (decide.lua), ARG_COST the cost, then
--       a leasing check's units wanted (ARG_WANT) and batch (ARG_BATCH), or a
--       give-back's end of its lease's window (ARG_BEFORE) and lease generation
--       (ARG_EPOCH); then optionally the client's clock in ms (else Redis TIME)
-- reply each policy's outcome (common.lua's put); a leasing check adds the
--       LEASE_FIELDS integers; packed into one string (common.lua's packed)
--
-- A reset deletes the keys (the lease generation too) and answers as a peek on
-- fresh state. A leasing check admits only if the cost and `batch` more units fit
-- (0: the cost alone), and leases (lease.lua). A give-back is a refund if the
-- store's clock is still before ARG_BEFORE (the end of the lease's window, ms) and
-- the subject's lease generation ("<TIME s><TIME us, 6 digits>", made by the
-- first grant, kept as long as the states, deleted by a reset) is still
-- ARG_EPOCH, else a peek: units of a past window, or counted before the state was
-- lost, are never taken from counts made since.

if not call then
  init()
end
CALL, CALL_KEYS = CALL + 1, KEYS
local set, bad = read_set(ARGV[ARG_SET] or "", 1)
if not set then
  return redis.error_reply(bad)
end
local n, nargs = set.keys, #ARGV
local fixed = op == OP_RESET and ARG_COST or ARG_EPOCH
if #KEYS ~= n + 1 or nargs < fixed or nargs > fixed + 1 then
  return redis.error_reply(fmt(
    "ERR redlimit: expected the set's keys and the lease key (%d), then %d arguments and an optional clock, got %d keys and %d arguments",
    n + 1, fixed, #KEYS, nargs))
end
local keeps, now = nargs == fixed, nil
if keeps then
  now = time_ms()
else
  now = tonum(ARGV[nargs])
end
local cost = tonum(ARGV[ARG_COST])
if not (now and cost) then
  return redis.error_reply(fmt("ERR redlimit: expected the cost and the clock in ms, got %q and %q",
    sub(ARGV[ARG_COST], 1, 24), sub(ARGV[nargs], 1, 24)))
end
local reply = {}
if op == OP_RESET then
  call("DEL", unpacked(KEYS))
  return packed(reply, run(OP_PEEK, set, nil, 0, cost, now, reply, 0, {}, false))
end
local raws = call("MGET", unpacked(KEYS, 1, n))
if op == OP_LEASE then
  local want, batch = tonum(ARGV[ARG_WANT]), tonum(ARGV[ARG_BATCH])
  if not (want and batch) then
    return redis.error_reply("ERR redlimit: a leasing check takes the units wanted and the batch")
  end
  return packed(reply, lease(KEYS, set, now, cost, want, batch, reply, raws, keeps))
end
local before, epoch = tonum(ARGV[ARG_BEFORE]), ARGV[ARG_EPOCH]
if not (before and find(epoch, "^%d+$")) then
  return redis.error_reply(fmt(
    "ERR redlimit: a give-back takes the end of its window (ms) and its lease generation (digits), got %q and %q",
    sub(ARGV[ARG_BEFORE], 1, 24), sub(epoch, 1, 24)))
end
local refund = now < before and call("GET", KEYS[n + 1]) == epoch
local r = run(refund and OP_REFUND or OP_PEEK, set, nil, 0, cost, now, reply, 0, raws, keeps)
write_all(KEYS, 1, n)
return packed(reply, r)
