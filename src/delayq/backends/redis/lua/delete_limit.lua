-- delete_limit: delete a flow-control limit (only at the version given, if any), and
-- let every parked job be decided again by the next claim.
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- ARGV[1..4]: job key prefix, now ("" = TIME), retention, shadow prefix (see _lib.lua)
-- ARGV[5]   pattern
-- ARGV[6]   the expected version, or "" for any
-- Returns {1, woke (0/1)} when deleted, {0, 0} when nothing was.
-- The flow keys are described in _flow.lua.
local pattern, expected = ARGV[5], ARGV[6]
local stored = redis.call('HGET', NS .. 'limits', pattern)
if not stored or (expected ~= '' and tonumber(string.match(stored, '^(%d+):'))
    ~= tonumber(expected)) then
  return {0, 0}
end
redis.call('HDEL', NS .. 'limits', pattern)
redis.call('HDEL', NS .. 'limitpat', pattern)
return {1, unpark_all()}
