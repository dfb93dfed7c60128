-- claim: hand up to `limit` due jobs to one worker under a lease.
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- ARGV[1..4]: job key prefix, now ("" = TIME), result_ttl ms, shadow prefix (see _lib.lua)
-- ARGV[5]   limit: the most jobs to claim
-- ARGV[6]   lease in seconds
-- ARGV[7]   the most expired leases to recover in this call
-- ARGV[8]   this claim request's key (same hash tag), unique per call and kept for its
--           retry: when it exists, the call is a retry whose first reply was lost, and
--           it returns the jobs that call claimed (those still held by its tokens)
-- ARGV[9]   the most expired finished records to drop from their indexes in this call
-- Returns {now, lease_until, next, woke, id1, fields1, id2, fields2, ...}: fields is the
-- job's HGETALL after the claim; next is the milliseconds until the next due job or lease
-- expiry after this claim ("" when there is none), so a worker can wait without asking
-- again; woke is 1 when the new lease ends before anything sleeping workers wait for.
--
-- First, expired leases go back to the due set (due at once), or to the
-- dead-letter set when the job has used all its attempts: no reaper process is
-- needed. Then due jobs are claimed in (run_at, enqueue order). When the claim
-- filled its limit and jobs remain that are due now, or due before any lease
-- ends, one more worker is woken (the wake-up passes on like a baton): the one
-- token an enqueue pushed was taken by this busy worker, so no idle worker
-- knows of them otherwise.
-- One is also woken when the new lease ends before both the head of the due set
-- and every other lease: a worker asleep toward a far-off job then learns of it,
-- and recovers the lease on time if this worker dies. Under load this never fires
-- (the head is near, or an older lease ends first); only a job claimed in a quiet
-- moment costs one extra wake-up.
local limit = tonumber(ARGV[5])
local lease = tonumber(ARGV[6])
local max_recover = tonumber(ARGV[7])
local now = fmt(NOW)
local REQUEST = ARGV[8]
local max_purge = tonumber(ARGV[9])
local REPLAY_MS = 60000 -- how long a claim request's record is kept for its retry

local prior = redis.call('LRANGE', REQUEST, 0, -1)
if #prior > 0 then
  local replay = {prior[1], prior[2], '', 0}
  for i = 3, #prior, 2 do
    local key = job_key(prior[i])
    local f = redis.call('HMGET', key, 'state', 'token')
    if f[1] == 'running' and f[2] == prior[i + 1] then
      replay[#replay + 1] = prior[i]
      replay[#replay + 1] = redis.call('HGETALL', key)
    end
  end
  return replay
end

-- Finished records expire by themselves; drop them from the per-state indexes
-- (a bounded number per call, so a lowered result_ttl never blocks the server).
for _, k in pairs(K_DONE) do
  local old = redis.call('ZRANGEBYSCORE', k, '-inf', fmt(NOW_MS), 'LIMIT', 0, max_purge)
  if #old > 0 then
    redis.call('ZREM', k, unpack(old))
  end
end

local expired = redis.call('ZRANGEBYSCORE', K_RUNNING, '-inf', fmt(NOW_MS), 'LIMIT', 0, max_recover)
for _, id in ipairs(expired) do
  local key = job_key(id)
  redis.call('ZREM', K_RUNNING, id)
  local f = redis.call('HMGET', key, 'state', 'attempts', 'max_attempts', 'lease_until')
  if f[1] == 'running' then
    local attempts, max_attempts = tonumber(f[2]), tonumber(f[3])
    -- The messages mirror lease_expired_error / lease_expired_note in _common.py.
    local at = format_time(tonumber(f[4]))
    if attempts >= max_attempts then
      bury(key, id, string.format('lease expired at %s after %d attempts (max_attempts=%d): '
        .. 'the worker holding it stopped or hung', at, attempts, max_attempts))
    else
      -- Due again from the moment its lease ran out: lateness (and the misfire
      -- policy) is measured from there, not from the first due time.
      local note = string.format('lease expired at %s during attempt %d: the worker holding '
        .. 'it stopped or hung; returned to the due set', at, attempts)
      redis.call('HSET', key, 'state', 'scheduled', 'run_at', f[4], 'last_error', note,
        'updated_at', now)
      redis.call('HDEL', key, 'lease_until')
      schedule(key, id, tonumber(f[4]), false)
    end
  end
end

local lease_until = NOW + lease
local lease_until_s = fmt(lease_until)
local result = {now, lease_until_s, '', 0}
local members = redis.call('ZRANGEBYSCORE', K_DUE, '-inf', fmt(NOW_MS), 'LIMIT', 0, limit)
local lease_before = nil -- the earliest lease deadline before this claim (ms)
if #members > 0 then
  lease_before = tonumber(redis.call('ZRANGE', K_RUNNING, 0, 0, 'WITHSCORES')[2])
end
local claimed = 0
local record = {now, lease_until_s}
for _, member in ipairs(members) do
  local id = string.sub(member, 17)
  local key = job_key(id)
  redis.call('ZREM', K_DUE, member)
  if SHADOW_PREFIX ~= '' then
    redis.call('DEL', SHADOW_PREFIX .. id)
  end
  if redis.call('HGET', key, 'state') == 'scheduled' then
    local token = redis.call('INCR', K_TOKEN)
    redis.call('HINCRBY', key, 'attempts', 1)
    redis.call('HSET', key, 'state', 'running', 'token', token, 'lease_until', lease_until_s,
      'updated_at', now)
    redis.call('ZADD', K_RUNNING, lease_until * 1000, id)
    claimed = claimed + 1
    record[#record + 1] = id
    record[#record + 1] = token
    result[#result + 1] = id
    result[#result + 1] = redis.call('HGETALL', key)
  end
end

if claimed > 0 then
  redis.call('RPUSH', REQUEST, unpack(record))
  redis.call('PEXPIRE', REQUEST, REPLAY_MS)
end

local head = redis.call('ZRANGE', K_DUE, 0, 0, 'WITHSCORES')
local next_ms = tonumber(head[2])
local lease_ms = lease_until * 1000
local wake = false
if #members == limit and next_ms then
  -- Waiters wake by the earliest lease at the latest (see below), so a head
  -- after it needs no token; one before it (or due now) does.
  local earliest_lease = lease_ms
  if lease_before and lease_before < earliest_lease then
    earliest_lease = lease_before
  end
  wake = next_ms <= NOW_MS or next_ms < earliest_lease
end
if claimed > 0 and (not next_ms or lease_ms < next_ms)
    and (not lease_before or lease_ms < lease_before) then
  wake = true
  result[4] = 1
end
-- At most one token: a token nobody took yet already wakes the next waiter.
if wake and redis.call('LLEN', K_WAKE) == 0 then
  redis.call('LPUSH', K_WAKE, '1')
end
local lease_head = redis.call('ZRANGE', K_RUNNING, 0, 0, 'WITHSCORES')
if lease_head[2] and (not next_ms or tonumber(lease_head[2]) < next_ms) then
  next_ms = tonumber(lease_head[2])
end
if next_ms then
  result[3] = fmt(next_ms - NOW_MS)
end
return result
