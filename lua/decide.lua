-- redlimit: the policy sets a call names, and one operation on one subject's
-- policies, on states read once per call: shared by the batch (batch.lua) and the
-- single calls (main.lua).

-- A policy set is sent as its definition, one "<code><flags>:<limit>:<n>[:<holder>];"
-- per policy (flags: FLAG_REQUESTS for a policy counting requests, FLAG_SHADOW for
-- a shadow policy; an in-flight policy's holder in 12 hex digits), after
-- SET_JOINT for a joint set (its policies' states in one key, see split and
-- join_parts), and read here once into a flat table, SET_FIELDS a policy (its
-- READ, STEP and ENCODE functions,
-- limit, n, shadow flag, algorithm code, and its ARG: the holder's 6 bytes for an
-- in-flight policy, true for one counting requests, else false), beside `n`, the
-- number of policies, `keys`, the number of keys a subject's record names (1 for
-- a joint set, else n), and `joint`. The function library keeps what it read, by definition, for
-- the calls after (a definition is the whole policy, so a set read is never stale);
-- at SETS_KEPT definitions it starts over.
local SETS, SETS_N = {}, 0

-- `arg` holds the definition from its byte `from` on (a batch's first argument
-- starts with its head), and is what the library keeps it by.
local function read_set(arg, from)
  local set = SETS[arg]
  if set then
    return set
  end
  local def = from > 1 and sub(arg, from) or arg
  local joint = sub(def, 1, #SET_JOINT) == SET_JOINT
  set = { n = 0, joint = joint }
  for code, flags, limit, n, holder in gmatch(def, "(%a%a)(%a*):(%d+):(%d+):?(%x*);") do
    local read = READ[code]
    limit, n = tonum(limit), tonum(n)
    local shadow, requests = find(flags, FLAG_SHADOW, 1, true) ~= nil, find(flags, FLAG_REQUESTS, 1, true) ~= nil
    local arg = requests
    if code == ALG_IN_FLIGHT then
      if #holder ~= 12 or requests then
        read = nil
      else
        arg = ""
        for i = 1, 12, 2 do
          arg = arg .. char(tonum(sub(holder, i, i + 1), 16))
        end
      end
    elseif holder ~= "" then
      read = nil
    end
    if joint and code == ALG_IN_FLIGHT then
      -- An in-flight state goes when its last holder does: it keeps a key of its own.
      read = nil
    end
    if not (read and limit and n and limit >= 1 and n >= 1 and limit < 9007199254740992 and n < 9007199254740992) then
      local known = {}
      for c in pairs(READ) do
        known[#known + 1] = c
      end
      table.sort(known)
      return nil, fmt(
        "ERR redlimit: policy %d must be one of this script's algorithms (%s) with a limit and a window or interval, got %q",
        set.n + 1, table.concat(known, ", "), sub(def, 1, 64))
    end
    local b = SET_FIELDS * set.n
    set[b + SET_READ], set[b + SET_STEP], set[b + SET_ENCODE] = read, STEP[code], ENCODE[code]
    set[b + SET_LIMIT], set[b + SET_N], set[b + SET_SHADOW], set[b + SET_CODE], set[b + SET_ARG] =
      limit, n, shadow, code, arg
    set.n = set.n + 1
  end
  if set.n == 0 or SET_FIELDS * set.n ~= #set or (joint and set.n < 2) then
    return nil, fmt("ERR redlimit: no policy set in %q (\"<code><flags>:<limit>:<n>;\" per policy, two or more in a joint set)", sub(def, 1, 64))
  end
  set.keys = joint and 1 or set.n
  if SETS_N >= SETS_KEPT then
    SETS, SETS_N = {}, 0
  end
  SETS[arg], SETS_N = set, SETS_N + 1
  return set
end

-- What a call knows of each key it names, by slot (its position in KEYS): the
-- state (A, B, C), what names the stored state's TTL (KEEP), and, for a key the
-- call must write, the function, the n and the now to write it with and how
-- (WMODE: WRITE_KEEP, a refund's state that keeps its TTL; WRITE_CHECK, kept when
-- the stored TTL already runs as far; WRITE_TTL, set anew). SEEN and DIRTY hold
-- the number of the call that read or changed the slot, so nothing is cleared
-- between calls. Made by scratch() the first time a call needs them: the function
-- library keeps them, a script (run anew on every call) makes them only when a call
-- of it uses them.
local A, B, C, KEEP, SEEN, DIRTY, WMODE, WENC, WN, WNOW
-- The number of the call, and its keys.
local CALL, CALL_KEYS = 0, nil
-- A check's per-policy results until every policy is decided (all or nothing), and
-- each policy's slot.
local OK, NA, NB, NC, KEEPS, REMAINING, RESET, RETRY, SLOT
-- A joint set's key: the call that split it (by slot), and the set it holds; each
-- state's bytes as read (by slot), each part's now and bytes to keep as they were,
-- and the parts as split or as joined.
local JOINED, JSET, JRAW, JNOW, JSAME, PARTS

-- What a call of one set, one key or one outcome uses in place of a new table (the
-- function library keeps them; a script makes them on every call).
local ONE_SET, ONE_RAW, ONE_REPLY = {}, {}, {}

local function scratch()
  A, B, C, KEEP, SEEN, DIRTY, WMODE, WENC, WN, WNOW = {}, {}, {}, {}, {}, {}, {}, {}, {}, {}
  OK, NA, NB, NC, KEEPS, REMAINING, RESET, RETRY, SLOT = {}, {}, {}, {}, {}, {}, {}, {}, {}
  JOINED, JSET, JRAW, JNOW, JSAME, PARTS = {}, {}, {}, {}, {}, {}
end

-- A joint set keeps its n policies' states in one key: for each of the first n - 1,
-- its length (one byte below 255, else 255 and four bytes big-endian), then the
-- states in order, the last taking the rest; an empty state is no state. One read
-- and one write a subject, where a key a policy costs Redis one of each a policy.

-- A state's length as the joint layout writes it before the state: its one-byte
-- strings made once each.
local LENGTHS = {}
local function length_of(len)
  local text = LENGTHS[len]
  if text then
    return text
  end
  if len < 255 then
    text = char(len)
    LENGTHS[len] = text
    return text
  end
  return "\255" .. pack(">I4", len)
end

-- Splits `raw` into PARTS[1..n] (false: no state). Bytes that are no such layout
-- are no state at all, as each READ reads bytes it did not write.
local function split(raw, n)
  local pos, size = 1, raw and #raw or 0
  for i = 1, n - 1 do
    local len = raw and byte(raw, pos)
    if len == 255 then
      len = pos + 4 <= size and sunpack(">I4", raw, pos + 1) or nil
      pos = pos + 4
    end
    if not len or pos + len > size then
      for j = 1, n do
        PARTS[j] = false
      end
      return
    end
    PARTS[i] = len > 0 and sub(raw, pos + 1, pos + len) or false
    pos = pos + 1 + len
  end
  PARTS[n] = pos <= size and sub(raw, pos) or false
end

-- Joins PARTS[1..n] (each a state's bytes, "" for none) into `key`, with the TTL
-- `ttl` or, when `kept`, the key's own; `same`: a part did not change or only
-- shrank, so the TTL is never set below the key's own (it runs as far as such a
-- part needs); `old`: the call read the key as a string (false: absent, written with
-- GET, see ttl_text); `now`: the call's Redis TIME, from which a new key's expiry is
-- set on Redis 8 (false on the client's clock and on Redis 7).
local function join_parts(key, n, ttl, kept, same, old, now)
  if same and not kept then
    local left = call("PTTL", key)
    if left > ttl then
      ttl = left
    end
  end
  local raw
  if n == 2 then
    -- The common set, joined in one concatenation (one new string).
    local first = PARTS[1]
    raw = (LENGTHS[#first] or length_of(#first)) .. first .. PARTS[2]
  else
    for i = 1, n - 1 do
      PARTS[i] = length_of(#PARTS[i]) .. PARTS[i]
    end
    raw = concat(PARTS, "", 1, n)
  end
  -- store's body, in place (a joint set's every write comes here); a new key's SET
  -- replies nil (see ttl_text).
  if kept then
    call("SET", key, raw, "KEEPTTL")
  elseif now and not old then
    local ends = now + (ttl < 1 and 1 or ttl)
    if try_call("SET", key, raw, "PXAT", ends == TTL_A and TTL_A_TEXT or ttl_text(ends), "GET") then
      call("SET", key, raw, "PX", ttl == TTL_A and TTL_A_TEXT or ttl_text(ttl))
    end
  else
    local px = ttl == TTL_A and TTL_A_TEXT or ttl_text(ttl)
    if old or try_call("SET", key, raw, "PX", px, "GET") then
      call("SET", key, raw, "PX", px)
    end
  end
end

-- Writes a joint set's states to `key`: each changed one's NA, NB, NC encoded at
-- JNOW[i] with KEEPS[i] (see ENCODE), each other one's bytes JSAME[i] as they were
-- (false: none). One key, so one TTL: kept when every changed state may keep it,
-- else the longest any changed state needs (join_parts).
local function write_joint(key, set)
  local n, ttl, kept, any, same = set.n, 0, true, false, false
  for i = 1, n do
    local raw = ""
    if NA[i] then
      local b = SET_FIELDS * (i - 1)
      local t, k
      raw, t, k = set[b + SET_ENCODE](set[b + SET_N], JNOW[i], NA[i], NB[i], NC[i], KEEPS[i])
      -- A refund's state only shrank: as one that did not change.
      any, kept, same = true, kept and k, same or KEEPS[i] == true
      if t > ttl then
        ttl = t
      end
    elseif JSAME[i] then
      raw, same = JSAME[i], true
    end
    PARTS[i] = raw
  end
  if any then
    -- Else nothing changed: nothing to write (write_all asks for every joint key it read).
    -- Its states may have come from records before: written as an existing key's.
    join_parts(key, n, ttl, kept, same, true)
  end
end

-- Policy i's slot in a joint set whose key is at slot k: k itself for the first,
-- past the call's keys for the others, so each has slots of its own. The first
-- time the call meets the key, its parts go into raws at those slots.
local function joint_slots(set, k, raws)
  local stride = #CALL_KEYS
  if JOINED[k] ~= CALL then
    JOINED[k], JSET[k] = CALL, set
    split(raws[k], set.n)
    for i = 1, set.n do
      local v = k + (i - 1) * stride
      raws[v], JRAW[v] = PARTS[i], PARTS[i]
    end
  end
  return stride
end

-- Marks slot k for writing with `mode` at `now`, by the policy at b of set.
local function mark(k, mode, set, b, now)
  if DIRTY[k] ~= CALL then
    DIRTY[k], WMODE[k] = CALL, mode
  elseif mode > WMODE[k] then
    WMODE[k] = mode
  end
  WENC[k], WN[k], WNOW[k] = set[b + SET_ENCODE], set[b + SET_N], now
end

-- Reads the state of each policy of `set` whose slot (as in run) the call has not
-- met yet: raws holds what the call's read returned, by slot. `keeps`: the stored
-- TTLs may be kept (the call decides on Redis TIME, the clock they were set on).
local function load(set, map, at, raws, keeps)
  if not A then
    scratch()
  end
  local joint, stride = set.joint and (map and map[at] or at + 1), 0
  if joint then
    stride = joint_slots(set, joint, raws)
  end
  for i = 1, set.n do
    local k = joint and joint + (i - 1) * stride or map and map[at + i - 1] or at + i
    SLOT[i] = k
    if SEEN[k] ~= CALL then
      SEEN[k] = CALL
      -- Never nil in these tables: Lua 5.1 makes a key for a nil it stores, and drops
      -- it at the next rehash, so storing nils makes and drops keys on every call.
      local a, b, c, keep = set[SET_FIELDS * (i - 1) + SET_READ](raws[k])
      A[k], B[k], C[k], KEEP[k] = a or false, b or false, c or false, keeps and keep or false
    end
  end
end

-- A check of `cost` at `now` on a one-policy set whose key is at slot k, on the
-- call's states: run's common case (a hot subject's checks in one batch), with load
-- and mark in place (their calls are a visible share of a decision that finds its
-- state already read).
local function check_slot(set, k, cost, now, reply, r, raws, keeps)
  if not A then
    scratch()
  end
  if SEEN[k] ~= CALL then
    SEEN[k] = CALL
    local a, b, c, keep = set[SET_READ](raws[k])
    A[k], B[k], C[k], KEEP[k] = a or false, b or false, c or false, keeps and keep or false
  end
  local arg, w = set[SET_ARG], set[SET_N]
  if arg then
    cost = arg == true and 1 or arg
  end
  local allowed, remaining, reset, retry, a, b, c =
    set[SET_STEP](set[SET_LIMIT], w, now, cost, A[k], B[k], C[k], false)
  if not allowed then
    return put(reply, r, false, remaining, reset, retry)
  end
  A[k], B[k], C[k] = a, b or false, c or false
  if DIRTY[k] ~= CALL then
    DIRTY[k], WMODE[k] = CALL, WRITE_CHECK
  elseif WMODE[k] < WRITE_CHECK then
    WMODE[k] = WRITE_CHECK
  end
  WENC[k], WN[k], WNOW[k] = set[SET_ENCODE], w, now
  if remaining < PACK_REMAINING_LIMIT and reset < PACK_RESET_LIMIT then
    reply[r + 1] = (reset * PACK_REMAINING_LIMIT + remaining) * 2 + 1
    return r + 1
  end
  return put(reply, r, true, remaining, reset, 0)
end

-- Runs operation `op` of `cost` at `now` on the policies of `set` for one subject:
-- policy i's key is at slot map[at + i - 1] (a record's bytes), or at + i without a map. Reads
-- each slot's state the first time the call meets it (raws: what the call's read
-- returned, by slot). A check decides every policy before it changes any state,
-- and changes policy i only if it admits and every enforced (non-shadow) policy
-- admits: enforced policies are all or nothing, a shadow one consumes when
-- enforcing it would have. A peek changes nothing; a refund gives the cost back
-- (the state only shrinks, so it keeps its TTL); a charge consumes it whatever the
-- limit (bounded by MAX_DEBT); a release or renewal (`cost`: the slots the holder
-- holds) changes the holder's in-flight entries. Each then answers as a peek (of
-- 1, after a charge, a release or a renewal). A request policy counts 1 whatever
-- the cost, and refunds and charges of cost units leave it alone; an in-flight
-- policy takes its holder where the others take the cost. Appends each policy's outcome to reply after r; returns the new end.
local function run(op, set, map, at, cost, now, reply, r, raws, keeps)
  local n = set.n
  if n == 1 and op == OP_CHECK then
    return check_slot(set, map and map[at] or at + 1, cost, now, reply, r, raws, keeps)
  end
  if not A then
    scratch()
  end
  if n == 1 and (op == OP_RELEASE or op == OP_RENEW) and set[SET_CODE] == ALG_IN_FLIGHT then
    -- A holder's release or renewal of its one in-flight policy (what the store sends
    -- for them): the general path below, in place, for one policy.
    local k = map and map[at] or at + 1
    local raw = raws[k]
    if SEEN[k] ~= CALL then
      SEEN[k] = CALL
      raw = set[SET_READ](raw) or false
      A[k], B[k], C[k], KEEP[k] = raw, false, false, false
    else
      raw = A[k]
    end
    local w, holder = set[SET_N], set[SET_ARG]
    local held = IN_FLIGHT_HOLD(op, w, now, cost, holder, raw) or false
    if held ~= raw then
      A[k], B[k], C[k] = held, false, false
      if map then
        mark(k, WRITE_TTL, set, 0, now)
      else
        -- No other record of the call names the key: written now.
        -- store's body, in place: a release is one of every request's two records.
        local raw, ttl = set[SET_ENCODE](w, now, held, false)
        if raw then
          call("SET", CALL_KEYS[k], raw, "PX", ttl == TTL_A and TTL_A_TEXT or ttl_text(ttl))
        else
          call("DEL", CALL_KEYS[k])
        end
      end
    end
    local allowed, remaining, reset, retry = set[SET_STEP](set[SET_LIMIT], w, now, holder, held, false, false, true)
    if allowed and remaining < PACK_REMAINING_LIMIT and reset < PACK_RESET_LIMIT then
      reply[r + 1] = (reset * PACK_REMAINING_LIMIT + remaining) * 2 + 1
      return r + 1
    end
    return put(reply, r, allowed, remaining, reset, retry)
  end
  -- Each policy's slot, its state read the first time the call meets it (load, in
  -- place).
  local joint, stride = set.joint and (map and map[at] or at + 1), 0
  if joint then
    stride = joint_slots(set, joint, raws)
  end
  for i = 1, n do
    local k = joint and joint + (i - 1) * stride or map and map[at + i - 1] or at + i
    SLOT[i] = k
    if SEEN[k] ~= CALL then
      SEEN[k] = CALL
      local a, b, c, keep = set[SET_FIELDS * (i - 1) + SET_READ](raws[k])
      A[k], B[k], C[k], KEEP[k] = a or false, b or false, c or false, keeps and keep or false
    end
  end
  local asked, check = cost, op == OP_CHECK
  if not check and op ~= OP_PEEK then
    for i = 1, n do
      local b = SET_FIELDS * (i - 1)
      local k = SLOT[i]
      local arg, code = set[b + SET_ARG], set[b + SET_CODE]
      if op == OP_RELEASE or op == OP_RENEW then
        if code == ALG_IN_FLIGHT then
          local held = IN_FLIGHT_HOLD(op, set[b + SET_N], now, cost, arg, A[k]) or false
          if held ~= A[k] then
            -- The state changed: what a check of it left beside it no longer holds.
            A[k], B[k], C[k] = held, false, false
            mark(k, WRITE_TTL, set, b, now)
          end
        end
      elseif not arg then
        if op == OP_REFUND then
          if A[k] then
            local a, bb, c = REFUND[code](set[b + SET_LIMIT], set[b + SET_N], now, cost, A[k], B[k], C[k])
            if a ~= nil then
              A[k], B[k], C[k] = a, bb or false, c or false
              mark(k, WRITE_KEEP, set, b, now)
            end
          end
        elseif op == OP_CHARGE then
          local a, bb, c = CHARGE[code](set[b + SET_LIMIT], set[b + SET_N], now, cost, A[k], B[k], C[k])
          A[k], B[k], C[k] = a, bb or false, c or false
          mark(k, WRITE_TTL, set, b, now)
        end
      end
    end
    if op ~= OP_REFUND then
      asked = 1
    end
  end
  local all = true
  for i = 1, n do
    local b = SET_FIELDS * (i - 1)
    local k = SLOT[i]
    local arg = set[b + SET_ARG]
    local units = asked
    if arg then
      units = arg == true and 1 or arg
    end
    local allowed, remaining, reset, retry, a, bb, c =
      set[b + SET_STEP](set[b + SET_LIMIT], set[b + SET_N], now, units, A[k], B[k], C[k], not check)
    if allowed and remaining < PACK_REMAINING_LIMIT and reset < PACK_RESET_LIMIT then
      -- put's common case, in place.
      r = r + 1
      reply[r] = (reset * PACK_REMAINING_LIMIT + remaining) * 2 + 1
    else
      r = put(reply, r, allowed, remaining, reset, retry)
    end
    if check then
      if allowed then
        NA[i], NB[i], NC[i] = a, bb or false, c or false
      else
        NA[i] = false
        if not set[b + SET_SHADOW] then
          all = false
        end
      end
    end
  end
  if check and all then
    -- Every admitted policy's new state is a value (a denied one's is false).
    for i = 1, n do
      local a = NA[i]
      if a then
        local k, b = SLOT[i], SET_FIELDS * (i - 1)
        A[k], B[k], C[k] = a, NB[i], NC[i]
        -- mark(k, WRITE_CHECK, ..), in place.
        if DIRTY[k] ~= CALL then
          DIRTY[k], WMODE[k] = CALL, WRITE_CHECK
        elseif WMODE[k] < WRITE_CHECK then
          WMODE[k] = WRITE_CHECK
        end
        WENC[k], WN[k], WNOW[k] = set[b + SET_ENCODE], set[b + SET_N], now
      end
    end
  end
  return r
end

-- check_once's joint set, whose states are in one key (`raw` as read): each state
-- decided in turn and, when admitted, encoded at once into PARTS (a denied state's
-- bytes stay as split), so nothing is kept between the decisions and the write;
-- the key is written when every enforced policy admits.
local function check_joint(set, cost, now, reply, r, raw, key, keeps)
  if not PARTS then
    scratch()
  end
  local n = set.n
  -- A new subject's key has no parts: no call of split (a call costs Redis about what
  -- a short step does).
  if raw then
    split(raw, n)
  else
    for i = 1, n do
      PARTS[i] = false
    end
  end
  local all, any, ttl, kept, same = true, false, 0, true, false
  for i = 1, n do
    local b = SET_FIELDS * (i - 1)
    local part = PARTS[i]
    local a, bb, c, keep = set[b + SET_READ](part)
    -- No in-flight policy is joint: ARG is true for a policy counting requests.
    local units = cost
    if set[b + SET_ARG] then
      units = 1
    end
    local allowed, remaining, reset, retry
    allowed, remaining, reset, retry, a, bb, c =
      set[b + SET_STEP](set[b + SET_LIMIT], set[b + SET_N], now, units, a, bb, c, false)
    if allowed and remaining < PACK_REMAINING_LIMIT and reset < PACK_RESET_LIMIT then
      r = r + 1
      reply[r] = (reset * PACK_REMAINING_LIMIT + remaining) * 2 + 1
    else
      r = put(reply, r, allowed, remaining, reset, retry)
    end
    if allowed then
      -- Encoded only while the key may still be written.
      if all then
        local t, k
        part, t, k = set[b + SET_ENCODE](set[b + SET_N], now, a, bb, c, keeps and keep)
        any, kept = true, kept and k
        if t > ttl then
          ttl = t
        end
      end
    elseif set[b + SET_SHADOW] then
      -- A denied shadow state stays in the key as it was.
      same = same or part ~= false
    else
      all = false
    end
    PARTS[i] = part or ""
  end
  if all and any then
    join_parts(key, n, ttl, kept, same, raw, keeps and ABSOLUTE_EXPIRY and now)
  end
  return r
end

-- A check of `cost` at `now` on the policies of `set` for one subject whose keys no
-- other record of the call names (slots at + 1 ..): as run decides it, each state
-- read, decided and written at once, with nothing kept for the records after.
local function check_once(set, at, cost, now, reply, r, raws, keys, keeps)
  local n = set.n
  if n == 1 then
    -- A key read as absent is no state: every algorithm's read says so (nil) for it,
    -- and a call saved is a visible share of a new subject's decision.
    local old, a, b, c, keep = raws[at + 1], nil, nil, nil, nil
    if old then
      a, b, c, keep = set[SET_READ](old)
    end
    local arg, w = set[SET_ARG], set[SET_N]
    if arg then
      cost = arg == true and 1 or arg
    end
    local allowed, remaining, reset, retry
    allowed, remaining, reset, retry, a, b, c = set[SET_STEP](set[SET_LIMIT], w, now, cost, a, b, c, false)
    if allowed then
      -- store's body, in place: a call is a visible share of a decision.
      local raw, ttl, kept = set[SET_ENCODE](w, now, a, b, c, keeps and keep)
      if kept then
        call("SET", keys[at + 1], raw, "KEEPTTL")
      elseif not raw then
        call("DEL", keys[at + 1])
      elseif keeps and ABSOLUTE_EXPIRY and not old then
        -- A new key on Redis 8 and Redis TIME: its expiry as the time it ends (see
        -- ttl_text).
        local ends = now + (ttl < 1 and 1 or ttl)
        if try_call("SET", keys[at + 1], raw, "PXAT", ends == TTL_A and TTL_A_TEXT or ttl_text(ends), "GET") then
          call("SET", keys[at + 1], raw, "PX", ttl == TTL_A and TTL_A_TEXT or ttl_text(ttl))
        end
      else
        -- A new key's SET replies nil (see ttl_text).
        local px = ttl == TTL_A and TTL_A_TEXT or ttl_text(ttl)
        if old or try_call("SET", keys[at + 1], raw, "PX", px, "GET") then
          call("SET", keys[at + 1], raw, "PX", px)
        end
      end
      -- put's common case, in place: the one call a decision saves is a visible share.
      if remaining < PACK_REMAINING_LIMIT and reset < PACK_RESET_LIMIT then
        reply[r + 1] = (reset * PACK_REMAINING_LIMIT + remaining) * 2 + 1
        return r + 1
      end
    end
    return put(reply, r, allowed, remaining, reset, retry)
  end
  if set.joint then
    return check_joint(set, cost, now, reply, r, raws[at + 1], keys[at + 1], keeps)
  end
  if not NA then
    scratch()
  end
  local all = true
  for i = 1, n do
    local b = SET_FIELDS * (i - 1)
    -- An absent key's state is nil, unread, as above.
    local old, a, bb, c, keep = raws[at + i], nil, nil, nil, nil
    if old then
      a, bb, c, keep = set[b + SET_READ](old)
    end
    local arg, units = set[b + SET_ARG], cost
    if arg then
      units = arg == true and 1 or arg
    end
    local allowed, remaining, reset, retry
    allowed, remaining, reset, retry, a, bb, c =
      set[b + SET_STEP](set[b + SET_LIMIT], set[b + SET_N], now, units, a, bb, c, false)
    if allowed and remaining < PACK_REMAINING_LIMIT and reset < PACK_RESET_LIMIT then
      r = r + 1
      reply[r] = (reset * PACK_REMAINING_LIMIT + remaining) * 2 + 1
      NA[i], NB[i], NC[i], KEEPS[i] = a, bb or false, c or false, keeps and keep or false
    else
      r = put(reply, r, allowed, remaining, reset, retry)
      if allowed then
        NA[i], NB[i], NC[i], KEEPS[i] = a, bb or false, c or false, keeps and keep or false
      else
        NA[i] = false
        if not set[b + SET_SHADOW] then
          all = false
        end
      end
    end
  end
  if all then
    for i = 1, n do
      -- Every admitted policy's new state is a value (a denied one's is false).
      if NA[i] then
        local b = SET_FIELDS * (i - 1)
        -- store's body, in place, as above.
        local raw, ttl, kept = set[b + SET_ENCODE](set[b + SET_N], now, NA[i], NB[i], NC[i], KEEPS[i])
        if kept then
          call("SET", keys[at + i], raw, "KEEPTTL")
        elseif not raw then
          call("DEL", keys[at + i])
        elseif keeps and ABSOLUTE_EXPIRY and not raws[at + i] then
          local ends = now + (ttl < 1 and 1 or ttl)
          if try_call("SET", keys[at + i], raw, "PXAT", ends == TTL_A and TTL_A_TEXT or ttl_text(ends), "GET") then
            call("SET", keys[at + i], raw, "PX", ttl == TTL_A and TTL_A_TEXT or ttl_text(ttl))
          end
        else
          local px = ttl == TTL_A and TTL_A_TEXT or ttl_text(ttl)
          if raws[at + i] or try_call("SET", keys[at + i], raw, "PX", px, "GET") then
            call("SET", keys[at + i], raw, "PX", px)
          end
        end
      end
    end
  end
  return r
end

-- What a write of slot k may keep of the key's TTL (ENCODE's `keep`), by how the
-- call changed it (WMODE).
local function keep_of(k)
  local mode = WMODE[k]
  if mode == WRITE_KEEP then
    return true
  elseif mode == WRITE_CHECK then
    return KEEP[k]
  end
  return nil
end

-- Writes every slot of from..to the call changed, each once, with the now of its
-- last change.
local function write_all(keys, from, to)
  for k = from, to do
    if JOINED[k] == CALL then
      -- A joint set's key: each changed state as it was left, each other one's bytes
      -- as read; write_joint writes it only if a state in it changed.
      local set = JSET[k]
      local stride = #CALL_KEYS
      for i = 1, set.n do
        local v = k + (i - 1) * stride
        if DIRTY[v] == CALL then
          NA[i], NB[i], NC[i], KEEPS[i], JNOW[i], JSAME[i] = A[v], B[v], C[v], keep_of(v), WNOW[v], false
        else
          NA[i], JSAME[i] = false, JRAW[v]
        end
      end
      write_joint(keys[k], set)
    elseif DIRTY[k] == CALL then
      store(keys[k], WENC[k](WN[k], WNOW[k], A[k], B[k], C[k], keep_of(k)))
    end
  end
end
