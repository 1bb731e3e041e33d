-- Sliding window counter: the previous and current windows' counts, the
-- previous one weighted by how much of it the sliding window still covers.
-- Translation of decide in src/algorithm/sliding_window.rs.
-- State: "<window index>:<previous count>:<current count>".
local function sliding_window(limit, w, now, cost, raw)
  local idx = idiv(now, w)
  local asked = now
  local prev, cur = 0, 0
  local window, p, c
  if raw then
    local a, b, d = string.match(raw, "^(%d+):(%d+):(%d+)$")
    window, p, c = field(a), field(b), field(d)
  end
  if window and window > idx + MAX_BACK then
    -- More than MAX_BACK windows ahead: state this clock cannot have written,
    -- not a clock that went back. Start fresh.
    window = nil
  end
  if window and p and c then
    if window > idx then
      -- The clock went back: clamp to the start of the stored window.
      idx = window
      now = idx * w
    end
    if window == idx then
      prev, cur = p, c
    elseif window + 1 == idx then
      prev = c
    end
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
