-- extend: renew a claim's lease to `lease` seconds from now (checks the fencing token).
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- ARGV[1..4]: job key prefix, now ("" = TIME), retention, shadow prefix (see _lib.lua)
-- ARGV[5]   job id
-- ARGV[6]   fencing token of the claim
-- ARGV[7]   lease in seconds
-- Returns {1, job fields (HGETALL)}, or {0, state, token} when the claim is stale.
local id, token, lease = ARGV[5], ARGV[6], tonumber(ARGV[7])
local key = job_key(id)
local is_stale = stale(key, token)
if is_stale then
  return is_stale
end
local lease_until = NOW + lease
redis.call('ZADD', K_RUNNING, lease_until * 1000, id)
redis.call('HSET', key, 'lease_until', fmt(lease_until), 'updated_at', fmt(NOW))
return {1, redis.call('HGETALL', key)}
