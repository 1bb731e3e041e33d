-- Sliding window counter: the previous and current windows' counts, the
-- previous one weighted by how much of it the sliding window still covers.
-- Translation of decide in src/algorithm/sliding_window.rs.
-- State: the current window's index, the previous and current windows' counts,
-- packed ">I4I4I4" (12 bytes, no more Redis 7 memory than an empty value), or
-- ">I7I7I7" when one reaches 2^32.

local function sliding_window_read(raw)
  if raw then
    local len = #raw
    local idx, prev, cur
    if len == 12 then
      idx, prev, cur = sunpack(">I4I4I4", raw)
    elseif len == 21 then
      idx, prev, cur = sunpack(">I7I7I7", raw)
    else
      return nil
    end
    -- A state with a count in its window was kept to the next window's end.
    return idx, prev, cur, cur > 0 and idx
  end
  return nil
end

-- The decision at `asked`: on the stored window when it is the current one; a
-- stored window just before the current one becomes the previous count; a clock
-- that went back (the stored window ahead, by up to MAX_BACK windows) is clamped
-- to the start of the stored window; further ahead, it is state this clock cannot
-- have written, read as fresh. The refund and the charge read the windows the same
-- way: this with a cost of 0.
local function sliding_window_step(limit, w, asked, cost, idx, prev, cur)
  local now = asked
  -- The window now is in, as common.lua's WINDOW_AT keeps it.
  local i = WINDOW_AT_INDEX
  if now ~= WINDOW_AT_NOW or w ~= WINDOW_AT_W then
    i = (now - fmod(now, w)) / w
    WINDOW_AT_NOW, WINDOW_AT_W, WINDOW_AT_INDEX = now, w, i
  end
  if idx and idx >= i - 1 and idx <= i + MAX_BACK then
    if idx > i then
      now = idx * w
    elseif idx < i then
      idx, prev, cur = i, cur, 0
    end
  else
    idx, prev, cur = i, 0, 0
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
  -- limit: no room. Without a previous count (a new subject's first windows), the
  -- room is the limit's: no division.
  local remaining
  if weighted == 0 then
    remaining = limit - cur
  else
    remaining = limit * w - weighted
    if remaining < 0 then
      remaining = 0
    end
    remaining = (remaining - fmod(remaining, w)) / w - cur
  end
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
  if allowed then
    return true, remaining, reset, 0, idx, prev, cur
  end
  local retry
  if cur + cost <= limit then
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
  return false, remaining, reset, retry, idx, prev, cur
end

-- The last state packed and its bytes, as the fixed window's (FW_RAW).
local SW_IDX, SW_PREV, SW_CUR, SW_RAW = -1, -1, -1, ""

-- Kept to the end of the next window (its `prev` is this window's count): a state
-- that counted in the stored window keeps its TTL.
local function sliding_window_encode(w, now, idx, prev, cur, keep)
  if idx ~= SW_IDX or prev ~= SW_PREV or cur ~= SW_CUR then
    if idx < 4294967296 and prev < 4294967296 and cur < 4294967296 then
      SW_RAW = pack(">I4I4I4", idx, prev, cur)
    else
      SW_RAW = pack(">I7I7I7", idx, prev, cur)
    end
    SW_IDX, SW_PREV, SW_CUR = idx, prev, cur
  end
  return SW_RAW, (idx + 2) * w - now, keep == true or (keep == idx and cur > 0)
end

READ[ALG_SLIDING_WINDOW], STEP[ALG_SLIDING_WINDOW], ENCODE[ALG_SLIDING_WINDOW] =
  sliding_window_read, sliding_window_step, sliding_window_encode
