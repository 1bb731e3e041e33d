-- redlimit: decide every policy of one subject in one call, all or nothing.
--
-- src/store/redis/script.rs wraps this file in each entry point: `op` is the
-- call's operation and `first` where its per-policy arguments start (check:
-- OP_CHECK, FIRST_CHECK; admin: ARGV[ARG_OP], FIRST_ADMIN; leasing check:
-- OP_LEASE, FIRST_LEASE; give-back: OP_GIVE_BACK, FIRST_GIVE_BACK). The layout
-- below is src/store/redis/contract's: the Lua reads its constants by name
-- (see common.lua), its encoders and reply types are the Rust side of it.
--
-- KEYS[i]              the state key of policy i (all in the subject's hash tag)
-- KEYS[n + 1]          a leasing check, a give-back and a reset only: the subject's
--                      lease generation key ("<TIME s><TIME us, 6 digits>", made by
--                      the first grant, kept as long as the states, deleted by a reset)
-- ARGV[ARG_COST]       the cost of the request
-- ARGV[ARG_OP]         admin only: OP_PEEK, OP_REFUND, OP_RESET or OP_CHARGE
-- ARGV[ARG_WANT]       leasing check only: the units wanted as a lease
-- ARGV[ARG_BATCH]      leasing check only: the batch: the check admits only if
--                      the cost and this many more units fit (0: the cost alone),
--                      and when denied the reply adds the wait until they do
-- ARGV[ARG_BEFORE]     give-back only: the end of the lease's window (ms) and
-- ARGV[ARG_EPOCH]      the lease generation its units were taken in: a refund if
--                      the store's clock is still before the end and the
--                      generation is still this one, else a peek (units of a past
--                      window, or counted before the state was lost, are never
--                      taken from counts made since)
-- ARGV[first + POLICY_ARGS(i-1) + POLICY_CODE]  algorithm of policy i (ALG_*)
--     [.. + POLICY_LIMIT] limit (capacity of a token bucket) of policy i,
--                      negative for a shadow policy (decides, never denies)
--     [.. + POLICY_N]  window in ms of policy i; for a token bucket its
--                      emission interval in us
-- ARGV[first + POLICY_ARGS n]  optional: the client's clock in ms; else Redis TIME
--
-- Reply: per policy REPLY_FIELDS integers: allowed (0/1), remaining, reset after
-- (ms), retry after (ms), at REPLY_ALLOWED, REPLY_REMAINING, REPLY_RESET,
-- REPLY_RETRY. A leasing check adds LEASE_FIELDS integers: the units granted as
-- a lease (LEASE_GRANT: taken from every policy beyond the cost, at most `want`
-- and what each admits now, at least `batch`; none while a shadow policy would
-- deny), the ms to the end of the shortest current window among the window
-- policies (LEASE_WINDOW_LEFT; 0: none; a lease never outlives it), when denied
-- the ms until the cost and the batch would fit (LEASE_AGAIN: the instance asks
-- again then), the end of that window on the store's clock (LEASE_WINDOW_END:
-- what a give-back sends back), and the lease generation the units were taken
-- in (LEASE_EPOCH; 0 when none were).
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
  -- Translation of the lease rule in src/algorithm/mod.rs (`lease`).
  local want, batch = tonumber(ARGV[ARG_WANT]), tonumber(ARGV[ARG_BATCH])
  if not (want and batch) then
    return redis.error_reply("ERR redlimit: a leasing check takes the units wanted and the batch")
  end
  local grant, window_left, again = 0, 0, 0
  -- When would the cost and `batch` more fit? (The crate keeps cost + batch within
  -- what every enforced policy admits at once.)
  local function wait_for_batch()
    local longest = 0
    for i = 1, nkeys do
      local at = first + POLICY_ARGS * (i - 1)
      local limit = tonumber(ARGV[at + POLICY_LIMIT])
      if limit > 0 then
        local _, _, _, retry = DECIDE[ARGV[at + POLICY_CODE]](limit, tonumber(ARGV[at + POLICY_N]), now, cost + batch, raws[i])
        if retry > longest then
          longest = retry
        end
      end
    end
    return longest
  end
  if all then
    -- At most what every policy admits now beyond the cost. No lease while a shadow
    -- policy would deny: the cost alone, so shadow reports stay those of checks.
    local room, shadow_denies = want, false
    for i = 1, nkeys do
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
      -- Fewer than a batch beyond the cost: denied, nothing written, until the cost
      -- and a batch fit. A unit at a time would cost a call a unit.
      again = wait_for_batch()
      all = false
      for i = 1, nkeys do
        local base = REPLY_FIELDS * (i - 1)
        if tonumber(ARGV[first + POLICY_ARGS * (i - 1) + POLICY_LIMIT]) > 0 then
          reply[base + REPLY_ALLOWED] = 0
          reply[base + REPLY_REMAINING] = 0
          reply[base + REPLY_RETRY] = again
        end
      end
    end
    for i = 1, nkeys do
      local at = first + POLICY_ARGS * (i - 1)
      local code, n = ARGV[at + POLICY_CODE], tonumber(ARGV[at + POLICY_N])
      if grant > 0 then
        -- The same decision for cost + grant: admitted, since grant fits every policy.
        local _, remaining, reset, _, ttl, nxt = DECIDE[code](math.abs(tonumber(ARGV[at + POLICY_LIMIT])), n, now, cost + grant, raws[i])
        local base = REPLY_FIELDS * (i - 1)
        reply[base + REPLY_REMAINING] = remaining
        reply[base + REPLY_RESET] = reset
        writes[i] = nxt
        writes[nkeys + i] = ttl
      end
      if code == ALG_FIXED_WINDOW or code == ALG_SLIDING_WINDOW then
        local left = n - now % n
        if window_left == 0 or left < window_left then
          window_left = left
        end
      end
    end
  elseif batch > 0 then
    again = wait_for_batch()
  end
  -- The lease generation: made by the first grant, kept as long as the states
  -- this grant writes. Give-backs apply only while it stands.
  local epoch = 0
  if grant > 0 then
    local current = redis.call("GET", lease_key)
    if not current then
      local t = redis.call("TIME")
      current = t[1] .. string.format("%06d", tonumber(t[2]))
    end
    local keep = 1
    for i = 1, nkeys do
      if writes[i] and writes[nkeys + i] > keep then
        keep = writes[nkeys + i]
      end
    end
    redis.call("SET", lease_key, current, "PX", int(keep))
    epoch = tonumber(current)
  end
  local tail = REPLY_FIELDS * nkeys
  reply[tail + LEASE_GRANT] = grant
  reply[tail + LEASE_WINDOW_LEFT] = window_left
  reply[tail + LEASE_AGAIN] = again
  reply[tail + LEASE_WINDOW_END] = window_left > 0 and now + window_left or 0
  reply[tail + LEASE_EPOCH] = epoch
end

if (op == OP_CHECK or op == OP_LEASE) and all then
  write_states(KEYS, 0, nkeys, writes)
end
return reply
