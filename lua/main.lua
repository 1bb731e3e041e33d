-- redlimit: decide every policy of one subject in one call, all or nothing.
--
-- src/store/redis/script.rs wraps this file in each entry point: `op` is the
-- call's operation and `first` where its per-policy arguments start (check:
-- OP_CHECK, FIRST_CHECK; admin: ARGV[ARG_OP], FIRST_ADMIN; leasing check:
-- OP_LEASE, FIRST_LEASE; give-back: OP_GIVE_BACK, FIRST_GIVE_BACK). The layout
-- of the keys, the arguments and the reply is documented once, in
-- src/store/redis/contract: the Lua reads its constants by name (see
-- common.lua), its encoders and reply types are the Rust side of it.
--
-- What the arguments mean: the limit of a token bucket is its capacity, its N
-- its emission interval in us (the others': the window in ms); a negative limit
-- is a shadow policy's (decides, never denies). A leasing check admits only if
-- the cost and ARGV[ARG_BATCH] more units fit (0: the cost alone), and leases
-- (lease.lua). A give-back is a refund if the store's clock is still before
-- ARGV[ARG_BEFORE] (the end of the lease's window, ms) and the subject's lease
-- generation ("<TIME s><TIME us, 6 digits>", made by the first grant, kept as
-- long as the states, deleted by a reset) is still ARGV[ARG_EPOCH], else a peek:
-- units of a past window, or counted before the state was lost, are never taken
-- from counts made since.
--
-- A leasing check's reply adds: the units granted as a lease (LEASE_GRANT: taken
-- from every policy beyond the cost, at most `want` and what each admits now, at
-- least `batch`; none while a shadow policy would deny), the ms to the end of the
-- shortest current window among the window policies (LEASE_WINDOW_LEFT; 0: none;
-- a lease never outlives it), when denied the ms until the cost and the batch
-- would fit (LEASE_AGAIN: the instance asks again then), the end of that window
-- on the store's clock (LEASE_WINDOW_END: what a give-back sends back), and the
-- lease generation the units were taken in (LEASE_EPOCH; 0 when none were).
-- A check decides every policy before any state is written, and writes policy
-- i only if it admits and every enforced (non-shadow) policy admits: enforced
-- policies are all or nothing, a shadow one consumes when enforcing it would
-- have. Every check write sets a TTL of the time its state needs.
--
-- The admin operations run the same per-algorithm code: a peek decides and
-- writes nothing; a refund gives back the cost (the algorithm's refund
-- function; the state only shrinks, so its key keeps its TTL) then answers as a
-- peek; a reset deletes the keys then answers as a peek on fresh state; a
-- charge consumes the cost from every policy whatever its limit (the algorithm's
-- charge function, bounded by MAX_DEBT; a debt the checks after it see), writes
-- each state with its TTL (it may be new), then answers as a peek of 1. The
-- crate clamps a charge's cost to that bound, so it is exact too.
--
-- The crate is this script's only caller and builds every policy and cost
-- valid (positive integers whose products stay below 2^53, a cost no policy
-- exceeds), so a call checks only what is cheap: the number of arguments, known
-- algorithms and operation, numbers where numbers go. Everything else a call
-- does is its decision. A script with another argument layout has another
-- SHA-1 (and the library another name), so instances of an older release keep
-- calling their own on the same state.

local nkeys = #KEYS
local lease_key
if op == OP_LEASE or op == OP_RESET or op == OP_GIVE_BACK then
  lease_key = KEYS[nkeys]
  nkeys = nkeys - 1
end
local clock_at = first + POLICY_ARGS * nkeys
local nargs = #ARGV
if nkeys == 0 or nargs < clock_at - 1 or nargs > clock_at then
  local head = "cost"
  if op == OP_LEASE then
    head = "cost, units wanted, batch"
  elseif op == OP_GIVE_BACK then
    head = "cost, window end, lease generation"
  elseif first == FIRST_ADMIN then
    head = "cost, operation"
  end
  return redis.error_reply(string.format(
    "ERR redlimit: expected one key per policy, then %d arguments (%s, %d per policy, optional clock), got %d keys and %d arguments",
    clock_at - 1, head, POLICY_ARGS, nkeys, nargs))
end
local now
if nargs == clock_at then
  now = tonumber(ARGV[clock_at])
else
  now = time_ms()
end
local cost = tonumber(ARGV[ARG_COST])
if op == OP_GIVE_BACK then
  local before, epoch = tonumber(ARGV[ARG_BEFORE]), ARGV[ARG_EPOCH]
  if not (before and string.match(epoch, "^%d+$")) then
    return redis.error_reply(string.format(
      "ERR redlimit: a give-back takes the end of its window (ms) and its lease generation (digits), got %q and %q",
      string.sub(ARGV[ARG_BEFORE], 1, 24), string.sub(epoch, 1, 24)))
  end
  if now and now < before and redis.call("GET", lease_key) == epoch then
    op = OP_REFUND
  else
    op = OP_PEEK
  end
end
if not (now and cost) or not (op == OP_CHECK or op == OP_PEEK or op == OP_REFUND or op == OP_RESET or op == OP_LEASE or op == OP_CHARGE or op == OP_RELEASE or op == OP_RENEW) then
  return redis.error_reply(string.format(
    "ERR redlimit: expected the cost, an operation (%s, %s, %s, %s, %s or %s) and the clock in ms, got %q, %q and %q",
    OP_PEEK, OP_REFUND, OP_RESET, OP_CHARGE, OP_RELEASE, OP_RENEW, string.sub(ARGV[ARG_COST], 1, 24), string.sub(tostring(op), 1, 8),
    string.sub(ARGV[clock_at] or "(Redis TIME)", 1, 24)))
end

if op == OP_RESET then
  redis.call("DEL", unpack(KEYS))
end

-- Decide every policy before writing anything. The tables start at the size of
-- one policy's (REPLY_FIELDS integers): growing them from empty costs a visible
-- share of a call.
local reply, writes = { 0, 0, 0, 0 }, { false, false }
-- A leasing check decides again on the same states: it keeps them.
local raws = op == OP_LEASE and {} or nil
local set, bad = read_policies(ARGV, first, nkeys)
if not set then
  return redis.error_reply(bad)
end
local all = decide_policies(KEYS, 0, set, op, now, cost, reply, 0, writes, raws)

if raws then
  local want, batch = tonumber(ARGV[ARG_WANT]), tonumber(ARGV[ARG_BATCH])
  if not (want and batch) then
    return redis.error_reply("ERR redlimit: a leasing check takes the units wanted and the batch")
  end
  -- The lease rule (lease.lua), on the same states.
  all = lease(set, raws, reply, writes, now, cost, want, batch, all, lease_key)
end

if (op == OP_CHECK or op == OP_LEASE) and all then
  write_states(KEYS, 0, nkeys, writes)
end
return reply
