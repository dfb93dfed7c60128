-- stats: counts by state and the next due time, read in one consistent step.
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- ARGV[1..4]: job key prefix, now ("" = TIME), retention, shadow prefix (see _lib.lua)
-- Returns {scheduled, due, running, succeeded, dead, cancelled, skipped, next_due ("" = none)}.
-- Read-only: finished records past their expiry are not counted (claims purge them).
local live = '(' .. fmt(NOW_MS)
local next_due = ''
local head = redis.call('ZRANGE', K_DUE, 0, 0)[1]
if head then
  next_due = redis.call('HGET', job_key(string.sub(head, 17)), 'run_at') or ''
end
return {
  redis.call('ZCARD', K_DUE),
  redis.call('ZCOUNT', K_DUE, '-inf', fmt(NOW_MS)),
  redis.call('ZCARD', K_RUNNING),
  redis.call('ZCOUNT', K_DONE.succeeded, live, '+inf'),
  redis.call('ZCARD', K_DEAD),
  redis.call('ZCOUNT', K_DONE.cancelled, live, '+inf'),
  redis.call('ZCOUNT', K_DONE.skipped, live, '+inf'),
  next_due,
}
