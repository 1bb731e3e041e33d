-- Sliding window counter: the previous and current windows' counts, the
-- previous one weighted by how much of it the sliding window still covers.
-- Translation of decide in src/algorithm/sliding_window.rs.
-- State: "<window index>:<previous count>:<current count>".

-- The state's reading comes first, shared by the check, the refund and the
-- charge: called without a cost (sliding_window(limit, w, now, nil, raw)), it
-- returns only that: the window a decision counts in, the time it decides at,
-- the previous and current windows' counts, and whether the stored state is that
-- window's. A clock that went back (the stored window ahead, by up to MAX_BACK
-- windows) is clamped to the start of the stored window; further ahead, it is
-- state this clock cannot have written, read as fresh. A stored window just
-- before the current one becomes the previous count. (In the check rather than a
-- function of its own: a script defines its functions again on every call, and
-- callgrind counts the difference.)
local function sliding_window(limit, w, now, cost, raw)
  local idx = idiv(now, w)
  local asked = now
  local prev, cur, stored = 0, 0, false
  if raw then
    local a, b, d = string.match(raw, "^(%d+):(%d+):(%d+)$")
    local window, p, c = field(a), field(b), field(d)
    if window and p and c and window <= idx + MAX_BACK then
      if window > idx then
        idx = window
        now = idx * w
        prev, cur, stored = p, c, true
      elseif window == idx then
        prev, cur, stored = p, c, true
      elseif window + 1 == idx then
        prev = c
      end
    end
  end
  if not cost then
    return idx, now, prev, cur, stored
  end
  local elapsed = now - idx * w
  -- The previous window's weight, scaled by w to stay in integers.
  local weighted = prev * (w - elapsed)
  -- Rust: (cur + cost) * w + weighted <= limit * w. Rearranged so that no
  -- intermediate value can reach 2^53 (limit * w is below it).
  local allowed = cur + cost <= limit and weighted <= (limit - cur - cost) * w
  if allowed then
    cur = cur + cost
  end
  -- A previous window charged past the limit (a debt) may weigh more than the
  -- limit: no room.
  local remaining = idiv(math.max(limit * w - weighted, 0), w) - cur
  if remaining < 0 then
    remaining = 0
  end
  -- Waits are counted from the time asked, as for the fixed window.
  local behind = now - asked
  local reset
  if cur > 0 then
    reset = behind + 2 * w - elapsed
  elseif prev > 0 then
    reset = behind + w - elapsed
  else
    reset = 0
  end
  local retry
  if allowed then
    retry = 0
  elseif cur + cost <= limit then
    -- This window has room once the previous one has decayed enough.
    retry = behind + w - idiv((limit - cur - cost) * w, prev) - elapsed
  else
    -- Only the next window has room: its `prev` will be today's `cur`.
    local into_next = w - idiv((limit - cost) * w, cur)
    if into_next < 0 then
      into_next = 0
    end
    retry = behind + (w - elapsed) + into_next
  end
  local nxt = nil
  if allowed then
    nxt = ints(idx, prev, cur)
  end
  return allowed, remaining, reset, retry, reset, nxt
end

DECIDE[ALG_SLIDING_WINDOW] = sliding_window
