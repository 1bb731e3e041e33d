-- redlimit: decide every policy of one subject in one call, all or nothing.
--
-- The store puts a line before this file: `local op, first = "c", 2` in the
-- check's script, `local op, first = ARGV[2], 3` in the admin operations' one,
-- `local op, first = "l", 4` in the leasing check's one.
--
-- KEYS[i]              the state key of policy i (all in the subject's hash tag)
-- KEYS[n + 1]          a leasing check, a give-back and a reset only: the subject's
--                      lease generation key ("<TIME s><TIME us, 6 digits>", made by
--                      the first grant, kept as long as the states, deleted by a reset)
-- ARGV[1]              the cost of the request
-- ARGV[2]              admin script only: p (peek), r (refund), x (reset), or
--                      g:<ms>:<epoch> (a lease's give-back: a refund if the store's
--                      clock is still before <ms>, the end of the lease's window, and
--                      the lease generation is still <epoch>, else a peek: units of a
--                      past window, or counted before the state was lost, are never
--                      taken from counts made since);
--                      leasing check only: the units wanted as a lease
-- ARGV[3]              leasing check only: the batch: the check admits only if
--                      the cost and this many more units fit (0: the cost alone),
--                      and when denied the reply adds the wait until they do
-- ARGV[first + 3(i-1)] algorithm of policy i: fw, sw, tb or sl
--     [first + 3(i-1) + 1] limit (capacity of a token bucket) of policy i,
--                      negative for a shadow policy (decides, never denies)
--     [first + 3(i-1) + 2] window in ms of policy i; for a token bucket its
--                      emission interval in us
-- ARGV[first + 3n]     optional: the client's clock in ms; without it, Redis TIME
--
-- Reply: per policy, allowed (0/1), remaining, reset after (ms), retry after (ms).
-- A leasing check adds four integers: the units granted as a lease (taken from
-- every policy beyond the cost, at most `want` and what each admits now, at least
-- `batch`; none while a shadow policy would deny), the ms to the end of the
-- shortest current window among the window policies (0: none; a lease never
-- outlives it), when denied the ms until the cost and the batch would fit (the
-- instance asks again then), the end of that window on the store's clock
-- (what a give-back sends back), and the lease generation the units were taken
-- in (0 when none were).
-- A check decides every policy before any state is written, and writes policy
-- i only if it admits and every enforced (non-shadow) policy admits: enforced
-- policies are all or nothing, a shadow one consumes when enforcing it would
-- have. Every check write sets a TTL of the time its state needs.
--
-- The admin operations run the same per-algorithm code: a peek decides and
-- writes nothing; a refund gives back the cost (the algorithm's refund
-- function; the state only shrinks, so its key keeps its TTL) then answers as a
-- peek; a reset deletes the keys then answers as a peek on fresh state.
--
-- The crate is this script's only caller and builds every policy and cost
-- valid (positive integers whose products stay below 2^53, a cost no policy
-- exceeds), so a call checks only what is cheap: the number of arguments, known
-- algorithms and operation, numbers where numbers go. Everything else a call
-- does is its decision. A script with another argument layout has another
-- SHA-1, so instances of an older release keep calling their own script on the
-- same state.

local nkeys = #KEYS
local lease_key
if op == "l" or op == "x" or string.sub(op, 1, 2) == "g:" then
  lease_key = KEYS[nkeys]
  nkeys = nkeys - 1
end
local clock_at = first + 3 * nkeys
local nargs = #ARGV
if nkeys == 0 or nargs < clock_at - 1 or nargs > clock_at then
  return redis.error_reply(string.format(
    "ERR redlimit: expected one key per policy, then %d arguments (cost%s, 3 per policy, optional clock), got %d keys and %d arguments",
    clock_at - 1, first == 3 and ", operation" or "", nkeys, nargs))
end
local now
if nargs == clock_at then
  now = tonumber(ARGV[clock_at])
else
  now = time_ms()
end
local cost = tonumber(ARGV[1])
if lease_key and op ~= "l" and op ~= "x" then
  local before, epoch = string.match(op, "^g:(%d+):(%d+)$")
  before = tonumber(before)
  if before and now < before and redis.call("GET", lease_key) == epoch then
    op = "r"
  elseif before then
    op = "p"
  end
end
if not (now and cost) or not (op == "c" or op == "p" or op == "r" or op == "x" or op == "l") then
  return redis.error_reply(string.format(
    "ERR redlimit: expected the cost, an operation (p, r, x or g:<ms>:<epoch>) and the clock in ms, got %q, %q and %q",
    string.sub(ARGV[1], 1, 24), string.sub(op, 1, 8), string.sub(ARGV[clock_at] or "(Redis TIME)", 1, 24)))
end

if op == "x" then
  redis.call("DEL", unpack(KEYS))
end

-- Decide every policy before writing anything. The tables start at the size of
-- one policy's: growing them from empty costs a visible share of a call.
local reply, writes = { 0, 0, 0, 0 }, { false, false }
-- A leasing check decides again on the same states: it keeps them.
local raws = op == "l" and {} or nil
local set, bad = read_policies(ARGV, first, nkeys)
if not set then
  return redis.error_reply(bad)
end
local all = decide_policies(KEYS, 0, set, op, now, cost, reply, 0, writes, raws)

if raws then
  -- Translation of the lease rule in src/algorithm/mod.rs (`lease`).
  local want, batch = tonumber(ARGV[2]), tonumber(ARGV[3])
  if not (want and batch) then
    return redis.error_reply("ERR redlimit: a leasing check takes the units wanted and the batch")
  end
  local grant, window_left, again = 0, 0, 0
  -- When would the cost and `batch` more fit? (The crate keeps cost + batch within
  -- what every enforced policy admits at once.)
  local function wait_for_batch()
    local longest = 0
    for i = 1, nkeys do
      local at = first + 3 * (i - 1)
      local limit = tonumber(ARGV[at + 1])
      if limit > 0 then
        local _, _, _, retry = DECIDE[ARGV[at]](limit, tonumber(ARGV[at + 2]), now, cost + batch, raws[i])
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
      local base = 4 * (i - 1)
      if reply[base + 1] == 0 then
        shadow_denies = true
      elseif reply[base + 2] < room then
        room = reply[base + 2]
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
        local base = 4 * (i - 1)
        if tonumber(ARGV[first + 3 * (i - 1) + 1]) > 0 then
          reply[base + 1] = 0
          reply[base + 2] = 0
          reply[base + 4] = again
        end
      end
    end
    for i = 1, nkeys do
      local at = first + 3 * (i - 1)
      local code, n = ARGV[at], tonumber(ARGV[at + 2])
      if grant > 0 then
        -- The same decision for cost + grant: admitted, since grant fits every policy.
        local _, remaining, reset, _, ttl, nxt = DECIDE[code](math.abs(tonumber(ARGV[at + 1])), n, now, cost + grant, raws[i])
        local base = 4 * (i - 1)
        reply[base + 2] = remaining
        reply[base + 3] = reset
        writes[i] = nxt
        writes[nkeys + i] = ttl
      end
      if code == "fw" or code == "sw" then
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
  reply[4 * nkeys + 1] = grant
  reply[4 * nkeys + 2] = window_left
  reply[4 * nkeys + 3] = again
  reply[4 * nkeys + 4] = window_left > 0 and now + window_left or 0
  reply[4 * nkeys + 5] = epoch
end

if (op == "c" or op == "l") and all then
  write_states(KEYS, 0, nkeys, writes)
end
return reply
