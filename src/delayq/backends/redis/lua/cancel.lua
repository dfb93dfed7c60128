-- cancel: cancel a scheduled job, or say why not.
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- ARGV[1..4]: job key prefix, now ("" = TIME), retention, shadow prefix (see _lib.lua)
-- ARGV[5]   job id
-- Returns "cancelled" (no attempt had started) | "cancelled_after_attempt" | "running" |
-- "finished" | "not_found". A running job whose lease has expired is not running: it
-- is recovered first (see recover_lease) and then cancelled (or it is dead: finished).
local id = ARGV[5]
local key = job_key(id)
local state = settled_state(key, id)
if not state then
  return 'not_found'
elseif state == 'running' then
  return 'running'
elseif state ~= 'scheduled' then
  return 'finished'
end
unschedule(key, id)
redis.call('HSET', key, 'state', 'cancelled', 'outcome', 'cancelled', 'updated_at', fmt(NOW))
finish(key, id, 'cancelled')
if tonumber(redis.call('HGET', key, 'attempts') or '0') > 0 then
  return 'cancelled_after_attempt'
end
return 'cancelled'
