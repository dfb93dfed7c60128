-- next_wake: how long a worker may sleep: milliseconds until the head of the
-- due set is due or the earliest lease expires, on the server's clock (0 while
-- jobs wait in the ready stage of flow control, see _flow.lua).
-- Read-only.
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- ARGV[1..4]: job key prefix, now ("" = TIME), retention, shadow prefix (see _lib.lua)
-- Returns "<ms> <at>" (ms may be <= 0: something is claimable now; at is that moment in
-- epoch ms), or "" when there is nothing to wait for.
local best = nil
local head = redis.call('ZRANGE', K_DUE, 0, 0, 'WITHSCORES')
if head[2] then
  best = tonumber(head[2])
end
if redis.call('ZRANGE', NS .. 'prios', 0, 0)[1] then
  best = NOW_MS
end
local lease = redis.call('ZRANGE', K_RUNNING, 0, 0, 'WITHSCORES')
if lease[2] and (not best or tonumber(lease[2]) < best) then
  best = tonumber(lease[2])
end
if not best then
  return ''
end
return fmt(best - NOW_MS) .. ' ' .. fmt(best)
