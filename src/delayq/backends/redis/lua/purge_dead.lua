-- purge_dead: delete dead jobs: all of them, the listed ones, or those buried
-- before a time.
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- ARGV[1..4]: job key prefix, now ("" = TIME), retention, shadow prefix (see _lib.lua)
-- ARGV[5]   older_than in epoch seconds, or "" for no time bound
-- ARGV[6]   the most jobs to delete in this call (bounds the script's time)
-- ARGV[7..] job ids; none means the oldest dead jobs (within the time bound)
-- Returns the number of jobs deleted.
local bound = '+inf'
if ARGV[5] ~= '' then
  bound = '(' .. fmt(tonumber(ARGV[5]) * 1000)
end
local ids = {}
if #ARGV >= 7 then
  for i = 7, #ARGV do
    local score = redis.call('ZSCORE', K_DEAD, ARGV[i])
    if score and (ARGV[5] == '' or tonumber(score) < tonumber(ARGV[5]) * 1000) then
      ids[#ids + 1] = ARGV[i]
    end
  end
else
  ids = redis.call('ZRANGEBYSCORE', K_DEAD, '-inf', bound, 'LIMIT', 0, tonumber(ARGV[6]))
end
for _, id in ipairs(ids) do
  redis.call('ZREM', K_DEAD, id)
  key_expires(job_key(id), id, 0)
  redis.call('DEL', job_key(id))
end
return #ids
