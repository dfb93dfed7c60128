-- put_limit: store a flow-control limit if its stored version is the one given
-- (compare-and-set), and let every parked job be decided again by the next claim.
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- ARGV[1..4]: job key prefix, now ("" = TIME), retention, shadow prefix (see _lib.lua)
-- ARGV[5]   pattern
-- ARGV[6]   the expected version (0: no record yet)
-- ARGV[7]   the limit, delayq.flow.Limit.to_json()
-- Returns {new version, woke (0/1)}, or {-1, 0} when the stored version differs.
-- The flow keys are described in _flow.lua.
local pattern, expected, data = ARGV[5], tonumber(ARGV[6]), ARGV[7]
local stored = redis.call('HGET', NS .. 'limits', pattern)
local version = stored and tonumber(string.match(stored, '^(%d+):')) or 0
if version ~= expected then
  return {-1, 0}
end
redis.call('HSET', NS .. 'limits', pattern, (version + 1) .. ':' .. data)
if string.find(pattern, '*', 1, true) then
  redis.call('HSET', NS .. 'limitpat', pattern, data)
end
redis.call('SET', NS .. 'flow', '1')
return {version + 1, unpark_all()}
