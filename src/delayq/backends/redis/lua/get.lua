-- get: one job's fields, honouring result_ttl on the deciding clock. Read-only
-- except that it deletes a finished record found past its result_ttl.
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- ARGV[1..4]: job key prefix, now ("" = TIME), retention, shadow prefix (see _lib.lua)
-- ARGV[5..] job ids
-- Returns one HGETALL per id (empty when the job does not exist).
local result = {}
for i = 5, #ARGV do
  local key = job_key(ARGV[i])
  if live_state(key, ARGV[i]) then
    result[#result + 1] = redis.call('HGETALL', key)
  else
    result[#result + 1] = {}
  end
end
return result
