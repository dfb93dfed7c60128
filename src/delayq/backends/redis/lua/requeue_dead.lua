-- requeue_dead: move a dead job back to the due set with its attempts reset.
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- ARGV[1..4]: job key prefix, now ("" = TIME), retention, shadow prefix (see _lib.lua)
-- ARGV[5]   job id
-- ARGV[6]   run_at in epoch seconds, or "+<seconds>" after the server's now
-- Returns {1, woke} or {0} when the job is not dead.
local id, run_at = ARGV[5], due_time(ARGV[6])
local key = job_key(id)
if redis.call('HGET', key, 'state') ~= 'dead' then
  return {0}
end
local before = head_score()
unindex_final(key, id, 'dead')
redis.call('HSET', key, 'state', 'scheduled', 'attempts', 0, 'run_at', fmt(run_at),
  'updated_at', fmt(NOW))
redis.call('HDEL', key, 'outcome', 'unstarted')
schedule(key, id, run_at, false)
return {1, wake_if_earlier(before)}
