-- claim: hand up to `limit` due jobs to one worker under a lease.
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- KEYS[10]  this claim request's key, unique per call and kept for its retry: when it
--           exists, the call is a retry whose first reply was lost, and it returns the
--           jobs that call claimed (those still held by its tokens)
-- ARGV[1..4]: job key prefix, now ("" = TIME), result_ttl ms, shadow prefix (see _lib.lua)
-- ARGV[5]   limit: the most jobs to claim
-- ARGV[6]   lease in seconds
-- ARGV[7]   the most expired leases to recover in this call
-- ARGV[8]   how long the request's record is kept for a retry, in ms
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
--
-- The request's record is one short string, "<now> <lease_until> <first token>
-- <last token>": the jobs of one claim share its lease deadline (their score in
-- the running set) and hold consecutive tokens, so a retry finds them there.
local limit = tonumber(ARGV[5])
local lease = tonumber(ARGV[6])
local max_recover = tonumber(ARGV[7])
local now = fmt(NOW)
local REQUEST = KEYS[10]
local replay_ms = tonumber(ARGV[8])
local max_purge = tonumber(ARGV[9])

local prior = redis.call('GET', REQUEST)
if prior then
  local p_now, p_lease, p_first, p_last = string.match(prior, '^(%S+) (%S+) (%S+) (%S+)$')
  local first, last = tonumber(p_first), tonumber(p_last)
  local replay = {p_now, p_lease, '', 0}
  local score = fmt(tonumber(p_lease) * 1000)
  local held = {}
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', K_RUNNING, score, score)) do
    local f = redis.call('HMGET', job_key(id), 'state', 'token')
    local token = tonumber(f[2])
    if f[1] == 'running' and token and token >= first and token <= last then
      held[#held + 1] = {token, id}
    end
  end
  table.sort(held, function(a, b) return a[1] < b[1] end) -- claim order
  for _, h in ipairs(held) do
    replay[#replay + 1] = h[2]
    replay[#replay + 1] = redis.call('HGETALL', job_key(h[2]))
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
  local f = redis.call('HMGET', key, 'state', 'attempts', 'max_attempts', 'lease_until')
  if f[1] == 'running' then
    recover_lease(key, id, f)
  else
    redis.call('ZREM', K_RUNNING, id)
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
local first_token = 0
if #members > 0 then
  first_token = new_tokens(#members)
end
for _, member in ipairs(members) do
  local id = string.sub(member, 17)
  local key = job_key(id)
  redis.call('ZREM', K_DUE, member)
  if SHADOW_PREFIX ~= '' then
    redis.call('DEL', SHADOW_PREFIX .. id)
  end
  if redis.call('HGET', key, 'state') == 'scheduled' then
    local token = string.format('%d', first_token + claimed)
    redis.call('HINCRBY', key, 'attempts', 1)
    redis.call('HSET', key, 'state', 'running', 'token', token, 'lease_until', lease_until_s,
      'updated_at', now)
    redis.call('ZADD', K_RUNNING, lease_until * 1000, id)
    claimed = claimed + 1
    result[#result + 1] = id
    result[#result + 1] = redis.call('HGETALL', key)
  end
end

if claimed > 0 then
  redis.call('SET', REQUEST, string.format('%s %s %d %d', now, lease_until_s, first_token,
    first_token + claimed - 1), 'PX', replay_ms)
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
