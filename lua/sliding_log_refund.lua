-- redlimit: the sliding log's refund, composed after sliding_log.lua only into what
-- gives units back (the admin operations, the give-back, the library).

-- Refund: remove the cost most recent stamps, only those still in the window
-- (now clamped to the newest stamp). Translation of refund in
-- src/algorithm/sliding_log.rs. The new state is rewritten in order, head 0.
REFUND[ALG_SLIDING_LOG] = function(limit, w, now, cost, raw)
  local n, head, base, len, stamp
  n, head, base, len, stamp, now = sl_read(raw, limit, w, now)
  if len == 0 then
    return nil
  end
  local drop = 0
  while drop < cost and drop < len and stamp(len - 1 - drop) + w > now do
    drop = drop + 1
  end
  if drop == 0 then
    return nil
  end
  return pack(">I4", 0) .. sl_copy(raw, n, head, base, 0, len - drop), nil
end
