-- redlimit: deciding one subject's policies and writing what they admit, shared
-- by the single call (main.lua) and the batch (batch.lua).

-- The error of a policy whose arguments are not one of this script's algorithms
-- with a limit and a window or interval.
local function bad_policy(i, code, limit, n)
  local known = {}
  for c in pairs(DECIDE) do
    known[#known + 1] = c
  end
  table.sort(known)
  return string.format(
    "ERR redlimit: policy %d must be one of this script's algorithms (%s) with a limit and a window or interval, got %q, %q and %q",
    i, table.concat(known, ", "), string.sub(code or "", 1, 8), string.sub(limit or "", 1, 24),
    string.sub(n or "", 1, 24))
end

-- The n policies whose arguments start at args[a0] (POLICY_ARGS each: code,
-- limit, window or interval, at POLICY_CODE, POLICY_LIMIT, POLICY_N), read once
-- into one flat table, the set (SET_FIELDS a policy: its decide function, limit,
-- window, shadow flag and code at SET_FIELDS(i-1) + SET_DECIDE, SET_LIMIT,
-- SET_WINDOW, SET_SHADOW, SET_CODE; see src/store/redis/contract). Or nil and
-- the error.
local function read_policies(args, a0, n)
  -- Sized for one policy (SET_FIELDS): growing a table from empty costs a
  -- visible share of a call.
  local set = { false, false, false, false, false }
  for i = 1, n do
    local at = a0 + POLICY_ARGS * (i - 1)
    local code = args[at + POLICY_CODE]
    local decide = DECIDE[code]
    -- An in-flight policy's code is followed by its holder's 16 hex digits.
    local holder
    if code == ALG_IN_FLIGHT then
      decide = nil
    elseif not decide and code and #code == #ALG_IN_FLIGHT + 16 and string.sub(code, 1, #ALG_IN_FLIGHT) == ALG_IN_FLIGHT then
      holder = string.sub(code, #ALG_IN_FLIGHT + 1)
      code = ALG_IN_FLIGHT
      decide = DECIDE[code]
    elseif not decide and code and string.sub(code, -#UNIT_REQUESTS) == UNIT_REQUESTS then
      -- A rate policy counting requests (its code, then UNIT_REQUESTS): one unit a
      -- request, whatever its cost.
      local base = string.sub(code, 1, #code - #UNIT_REQUESTS)
      if base ~= ALG_IN_FLIGHT and DECIDE[base] then
        code, decide = base, DECIDE[base]
        set.per_request = set.per_request or {}
        set.per_request[i] = true
      end
    end
    local limit, window = tonumber(args[at + POLICY_LIMIT]), tonumber(args[at + POLICY_N])
    if not (decide and limit and window) then
      return nil, bad_policy(i, code, args[at + POLICY_LIMIT], args[at + POLICY_N])
    end
    -- A shadow policy's limit comes negative: it decides, never denies.
    local shadow = limit < 0
    if shadow then
      limit = -limit
    end
    local b = SET_FIELDS * (i - 1)
    set[b + SET_DECIDE], set[b + SET_LIMIT], set[b + SET_WINDOW], set[b + SET_SHADOW], set[b + SET_CODE] =
      decide, limit, window, shadow, code
    if holder then
      -- Beside the array part: #set still counts SET_FIELDS a policy.
      set.holders = set.holders or {}
      set.holders[i] = holder
    end
  end
  return set
end

-- Decides the policies of one subject (a table of read_policies) before writing
-- anything: policy i's key is keys[k0 + i], its reply integers
-- reply[r0 + REPLY_FIELDS(i-1) + REPLY_ALLOWED..REPLY_RETRY]. Sets writes[i] (the state to write, false for
-- none) and writes[n + i] (its TTL); raws[i] keeps the state read, when raws is
-- a table. A refund (OP_REFUND) gives the cost back first; a charge (OP_CHARGE)
-- consumes it first whatever the limit, writes it, and decides a cost of 1; a
-- reset (OP_RESET) reads nothing. Without a batch, each state is a GET; a
-- batch's checks read the states the batch has written so far, else what its
-- one MGET read (a redis.call costs more than the read), else a GET.
local function decide_policies(keys, k0, set, op, now, cost, reply, r0, writes, raws, batch)
  local all, n, holders, per_request = true, #set / SET_FIELDS, set.holders, set.per_request
  -- A release or renewal carries its holder's count where the cost goes; it
  -- answers as a peek of 1.
  local held = cost
  if op == OP_RELEASE or op == OP_RENEW then
    cost = 1
  end
  for i = 1, n do
    local b = SET_FIELDS * (i - 1)
    local limit, window = set[b + SET_LIMIT], set[b + SET_WINDOW]
    local key = keys[k0 + i]
    local raw = false
    if batch then
      local kept = batch.state
      if kept then
        raw = kept[key]
      else
        raw = nil
      end
      if raw == nil then
        if kept and batch.reread[key] then
          raw = redis.call("GET", key)
        else
          raw = batch.stored[k0 + i]
        end
      end
    elseif op ~= OP_RESET then
      raw = redis.call("GET", key)
    end
    if raws then
      raws[i] = raw
    end
    local holder = holders and holders[i]
    local allowed, remaining, reset, retry, ttl, nxt
    if holder then
      -- In flight: a release or renewal writes at once; the decision takes the
      -- holder where the others take the cost (a charge or refund of units
      -- leaves slots alone).
      if op == OP_RELEASE or op == OP_RENEW then
        -- The new entry and the peek of 1 it answers with, from one parse.
        local kept, keep
        kept, keep, allowed, remaining, reset, retry = IN_FLIGHT_HOLD(op, limit, window, now, held, raw, holder)
        if kept then
          redis.call("SET", key, kept, "PX", math.max(keep, 1))
        elseif raw then
          redis.call("DEL", key)
        end
        ttl, nxt = 0, nil
      else
        allowed, remaining, reset, retry, ttl, nxt = set[b + SET_DECIDE](limit, window, now, holder, raw, op ~= OP_CHECK)
      end
    else
      local asked = cost
      if per_request and per_request[i] then
        -- One a request; refunds and charges of cost units leave it alone.
        asked = 1
      elseif op == OP_REFUND and raw then
        local given_back = REFUND[set[b + SET_CODE]](limit, window, now, cost, raw)
        if given_back then
          redis.call("SET", key, given_back, "KEEPTTL")
          raw = given_back
        end
      elseif op == OP_CHARGE then
        -- Whatever the limit, shadow or not; the state may be new. Then a peek of 1.
        local charged, charged_ttl = CHARGE[set[b + SET_CODE]](limit, window, now, cost, raw)
        redis.call("SET", key, charged, "PX", math.max(charged_ttl, 1))
        raw, asked = charged, 1
      end
      allowed, remaining, reset, retry, ttl, nxt = set[b + SET_DECIDE](limit, window, now, asked, raw)
    end
    local base = r0 + REPLY_FIELDS * (i - 1)
    if allowed then
      reply[base + REPLY_ALLOWED] = 1
      writes[i] = nxt
      writes[n + i] = ttl
    else
      reply[base + REPLY_ALLOWED] = 0
      writes[i] = false
      if not set[b + SET_SHADOW] then
        all = false
      end
    end
    reply[base + REPLY_REMAINING] = remaining
    reply[base + REPLY_RESET] = reset
    reply[base + REPLY_RETRY] = retry
  end
  return all
end

-- Writes the states decide_policies left in writes for keys[k0 + 1 .. k0 + n],
-- each with its TTL: a string is the whole state, a table the ranges to
-- overwrite (offset, bytes, ...) in a state that keeps its length. In a batch
-- where a subject comes again, a whole state is kept for the checks after it
-- and written once, by write_batch, with the TTL of the last; ranges are
-- written at once, and the key read again by the next check that needs it.
local function write_states(keys, k0, n, writes, batch)
  for i = 1, n do
    local nxt = writes[i]
    if nxt then
      local key = keys[k0 + i]
      local ttl = math.max(writes[n + i], 1)
      local kept = batch and batch.state
      if type(nxt) == "table" then
        for j = 1, #nxt, 2 do
          redis.call("SETRANGE", key, nxt[j], nxt[j + 1])
        end
        redis.call("PEXPIRE", key, ttl)
        if kept then
          batch.reread[key] = true
        end
      elseif kept then
        if batch.state[key] == nil then
          batch.keys[#batch.keys + 1] = key
        end
        batch.state[key], batch.ttl[key] = nxt, ttl
      else
        redis.call("SET", key, nxt, "PX", ttl)
      end
    end
  end
end

-- What a batch keeps between its checks: the states read by its MGET; where a
-- subject comes again (repeats), the whole states written so far (and their
-- TTLs, in the order first written) and the keys written as ranges, to read
-- again. Without repeats, each state is read once and written at once: the
-- tables would cost more than they save.
local function new_batch(stored, repeats)
  if not repeats then
    return { stored = stored }
  end
  return { stored = stored, state = {}, ttl = {}, keys = {}, reread = {} }
end

-- Writes the whole states a batch kept, each once.
local function write_batch(batch)
  if not batch.state then
    return
  end
  for _, key in ipairs(batch.keys) do
    redis.call("SET", key, batch.state[key], "PX", batch.ttl[key])
  end
end
