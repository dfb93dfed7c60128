-- get: one job's fields, honouring result_ttl on the deciding clock. Read-only
-- except that it deletes a finished record found past its result_ttl.
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- ARGV[1..4]: job key prefix, now ("" = TIME), retention, shadow prefix (see _lib.lua)
-- ARGV[5..] job ids
-- Returns one HGETALL per id (empty when the job does not exist); the current job of a
-- keyed call's key has its record's fields after them, each named "key.<field>".
local KEY_FIELDS = {'mode', 'runs', 'first_at', 'extended', 'items', 'calls'}
local result = {}
for i = 5, #ARGV do
  local key = job_key(ARGV[i])
  if live_state(key, ARGV[i]) then
    local fields = redis.call('HGETALL', key)
    local record = key_record(key, ARGV[i])
    if record then
      local values = redis.call('HMGET', record, unpack(KEY_FIELDS))
      for j, name in ipairs(KEY_FIELDS) do
        fields[#fields + 1] = 'key.' .. name
        fields[#fields + 1] = values[j]
      end
    end
    result[#result + 1] = fields
  else
    result[#result + 1] = {}
  end
end
return result
