-- extend: renew claims' leases to `lease` seconds from now (checks each fencing token).
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- ARGV[1..4]: job key prefix, now ("" = TIME), retention, shadow prefix (see _lib.lua)
-- ARGV[5]   lease in seconds
-- ARGV[6..] triples: job id, fencing token of the claim, 1 when its handler started (else 0)
-- Returns one reply per claim: {1, job fields (HGETALL)}, or {0, state, token} when the
-- claim is stale (that entry changes nothing; the others still apply).
local lease = tonumber(ARGV[5])
local lease_until = NOW + lease
local replies = {}
for i = 6, #ARGV, 3 do
  local id, token = ARGV[i], ARGV[i + 1]
  local key = job_key(id)
  local is_stale = stale(key, token)
  if is_stale then
    replies[#replies + 1] = is_stale
  else
    redis.call('ZADD', K_RUNNING, lease_until * 1000, id)
    redis.call('HSET', key, 'lease_until', fmt(lease_until), 'updated_at', fmt(NOW))
    if ARGV[i + 2] == '1' then
      redis.call('HSET', key, 'started', 1)
    end
    replies[#replies + 1] = {1, redis.call('HGETALL', key)}
  end
end
return replies
