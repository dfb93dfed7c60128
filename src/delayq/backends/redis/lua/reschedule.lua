-- reschedule: move a scheduled job to a new due time, or say why not.
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- ARGV[1..4]: job key prefix, now ("" = TIME), retention, shadow prefix (see _lib.lua)
-- ARGV[5]   job id
-- ARGV[6]   run_at in epoch seconds, or "+<seconds>" after the server's now
-- Returns {"rescheduled" | "rescheduled_after_attempt" | "running" | "finished" |
-- "not_found", woke (0/1)}. A running job whose lease has expired is not running: it is
-- recovered first (see recover_lease) and then moved (or it is dead: finished).
local id, run_at = ARGV[5], due_time(ARGV[6])
local key = job_key(id)
local state = settled_state(key, id)
if not state then
  return {'not_found', 0}
elseif state == 'running' then
  return {'running', 0}
elseif state ~= 'scheduled' then
  return {'finished', 0}
end
local before = head_score()
unschedule(key, id)
redis.call('HSET', key, 'run_at', fmt(run_at), 'updated_at', fmt(NOW))
schedule(key, id, run_at, false)
local outcome = 'rescheduled'
if tonumber(redis.call('HGET', key, 'attempts')) > 0 then
  outcome = 'rescheduled_after_attempt'
end
return {outcome, wake_if_earlier(before)}
