-- complete: finish a batch of claims in one call (group commit); each entry is an
-- ack, a retry or a bury and checks its own fencing token. Entries apply in order;
-- a stale one is skipped and reported, the others still apply.
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- ARGV[1..4]: job key prefix, now ("" = TIME), result_ttl ms, shadow prefix (see _lib.lua)
-- ARGV[5]   n, the number of entries; then 5 fields per entry from ARGV[6]:
--           job id, fencing token, target state ("succeeded" | "skipped": ack,
--           "scheduled": retry, "dead": bury, "release": give an unstarted claim
--           back), run_at in epoch seconds (retry; else ""),
--           text (ack: outcome note or ""; retry and bury: error text; release: its note)
-- Returns {woke (0/1), reply1, ..., replyN}: reply is {1} when applied, or
-- {0, state, token} when that entry's claim is stale.
local n = tonumber(ARGV[5])
local FIELDS = 5
-- The head of the due set before the first retry (acks and buries do not move it).
local before = nil
local retried = false
local result = {0}
for i = 0, n - 1 do
  local base = 6 + i * FIELDS
  local id, token, state = ARGV[base], ARGV[base + 1], ARGV[base + 2]
  local key = job_key(id)
  local is_stale = stale(key, token)
  if is_stale then
    result[#result + 1] = is_stale
  else
    if state == 'release' then
      -- Back to its original run_at (its place in the due order), the attempt given back.
      if not retried then
        before = head_score()
        retried = true
      end
      redis.call('ZREM', K_RUNNING, id)
      redis.call('HINCRBY', key, 'attempts', -1)
      -- A real error of an earlier attempt stays; the note only fills an empty one.
      redis.call('HSET', key, 'state', 'scheduled', 'updated_at', fmt(NOW))
      redis.call('HSETNX', key, 'last_error', ARGV[base + 4])
      redis.call('HDEL', key, 'lease_until')
      schedule(key, id, tonumber(redis.call('HGET', key, 'run_at')), false)
    elseif state == 'scheduled' then
      if not retried then
        before = head_score()
        retried = true
      end
      retry_job(key, id, ARGV[base + 3], ARGV[base + 4])
    elseif state == 'dead' then
      redis.call('ZREM', K_RUNNING, id)
      bury(key, id, ARGV[base + 4])
    else
      ack_job(key, id, state, ARGV[base + 4])
    end
    result[#result + 1] = {1}
  end
end
if retried then
  result[1] = wake_if_earlier(before)
end
return result
