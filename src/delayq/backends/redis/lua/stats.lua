-- stats: counts by state and the next due time, read in one consistent step.
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- ARGV[1..4]: job key prefix, now ("" = TIME), retention, shadow prefix (see _lib.lua)
-- Returns {scheduled, due, running, succeeded, dead, cancelled, skipped, next_due ("" = none)}.
-- Read-only: finished records past their expiry are not counted (claims purge them).
-- Jobs in flow control's ready stage or parked (N:held, see _flow.lua) are scheduled
-- and due.
local live = '(' .. fmt(NOW_MS)
local next_due = ''
for _, index in ipairs({K_DUE, NS .. 'held'}) do
  local head = redis.call('ZRANGE', index, 0, 0)[1]
  local run_at = head and redis.call('HGET', job_key(string.sub(head, 17)), 'run_at')
  if run_at and (next_due == '' or tonumber(run_at) < tonumber(next_due)) then
    next_due = run_at
  end
end
local held = redis.call('ZCARD', NS .. 'held')
return {
  redis.call('ZCARD', K_DUE) + held,
  redis.call('ZCOUNT', K_DUE, '-inf', fmt(NOW_MS)) + held,
  redis.call('ZCARD', K_RUNNING),
  redis.call('ZCOUNT', K_DONE.succeeded, live, '+inf')
    + redis.call('ZCOUNT', K_DONE.succeeded .. ':compact', live, '+inf'),
  redis.call('ZCARD', K_DEAD),
  redis.call('ZCOUNT', K_DONE.cancelled, live, '+inf')
    + redis.call('ZCOUNT', K_DONE.cancelled .. ':compact', live, '+inf'),
  redis.call('ZCOUNT', K_DONE.skipped, live, '+inf')
    + redis.call('ZCOUNT', K_DONE.skipped .. ':compact', live, '+inf'),
  next_due,
}
