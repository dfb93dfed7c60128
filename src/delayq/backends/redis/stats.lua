-- stats: counts by state and the next due time, read in one consistent step.
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- ARGV[1..4]: job key prefix, now ("" = TIME), result_ttl ms, shadow prefix (see _lib.lua)
-- Returns {scheduled, due, running, succeeded, dead, cancelled, skipped, next_due ("" = none)}.
-- Expired finished records are dropped from their indexes first.
for _, k in pairs(K_DONE) do
  redis.call('ZREMRANGEBYSCORE', k, '-inf', fmt(NOW_MS))
end
local next_due = ''
local head = redis.call('ZRANGE', K_DUE, 0, 0)[1]
if head then
  next_due = redis.call('HGET', job_key(string.sub(head, 17)), 'run_at') or ''
end
return {
  redis.call('ZCARD', K_DUE),
  redis.call('ZCOUNT', K_DUE, '-inf', fmt(NOW_MS)),
  redis.call('ZCARD', K_RUNNING),
  redis.call('ZCARD', K_DONE.succeeded),
  redis.call('ZCARD', K_DEAD),
  redis.call('ZCARD', K_DONE.cancelled),
  redis.call('ZCARD', K_DONE.skipped),
  next_due,
}
