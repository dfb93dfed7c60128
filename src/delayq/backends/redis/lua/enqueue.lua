-- enqueue: store a batch of jobs atomically (all or none).
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- ARGV[1..4]: job key prefix, now ("" = TIME), retention, shadow prefix (see _lib.lua)
-- ARGV[5]   on_conflict: "reject" | "keep" | "replace"
-- ARGV[6]   n, the number of jobs
-- ARGV[7]   p, the number of profiles: the fields that jobs of one batch usually
--           share, sent once; then 5 fields per profile from ARGV[10]:
--           name, max_attempts, backoff (JSON), misfire, created_at (s; 0 = now)
-- ARGV[8]   "1": only check (pass 1), write nothing: the first pass over a batch sent
--           in several calls, so a conflict anywhere stores none of it
-- ARGV[9]   "1": the jobs carry flow-control fields (3 more per job, below); the queue
--           then uses flow control from now on (see _flow.lua)
-- then 4 fields per job from ARGV[10 + 5p]: id, payload, run_at (epoch s, or "+<s>": that
-- many seconds after the server's now), profile (1..p); with ARGV[9], 3 more: flow key,
-- priority, group ("" = none; priority "0" = the default)
-- Returns {"ok", woke (0/1), outcome...} with outcome "created" | "kept" | "replaced"
-- (none when only checking), or {"conflict", id, state} when nothing was stored.
local on_conflict = ARGV[5]
local n = tonumber(ARGV[6])
local p = tonumber(ARGV[7])
local with_flow = ARGV[9] == '1'
local PROFILE_FIELDS, FIELDS = 5, with_flow and 7 or 4
local FIRST = 10 + p * PROFILE_FIELDS
local check_only = ARGV[8] == '1'

-- Pass 1: decide every outcome before writing anything (a failing check must
-- leave the store untouched; Lua scripts do not roll back).
local outcomes = {}
local seen = {}
for i = 0, n - 1 do
  local id = ARGV[FIRST + i * FIELDS]
  local state = seen[id] or live_state(job_key(id), id)
  if not state then
    outcomes[i] = 'created'
  elseif on_conflict == 'keep' then
    outcomes[i] = 'kept'
  elseif on_conflict == 'replace' and state ~= 'running' then
    outcomes[i] = 'replaced'
  else
    return {'conflict', id, state}
  end
  if outcomes[i] ~= 'kept' then
    seen[id] = 'scheduled'
  end
end

if check_only then
  return {'ok', 0}
end

-- Pass 2: write. New jobs take consecutive sequence numbers (one INCRBY),
-- their hash in one HSET, and the due set in ZADDs of up to 500 jobs.
local before = head_score()
local now = fmt(NOW)
local profiles = {}
for j = 1, p do
  local base = 10 + (j - 1) * PROFILE_FIELDS
  local created_at = ARGV[base + 4]
  if tonumber(created_at) == 0 then
    created_at = now
  end
  profiles[j] = {ARGV[base], ARGV[base + 1], ARGV[base + 2], ARGV[base + 3], created_at}
end
local fresh = 0
for i = 0, n - 1 do
  if outcomes[i] ~= 'kept' then
    fresh = fresh + 1
  end
end
local seq = redis.call('INCRBY', K_SEQ, fresh) - fresh
if with_flow then
  redis.call('SET', NS .. 'flow', '1')
end
local zadd = {}
local result = {'ok', 0}
for i = 0, n - 1 do
  local base = FIRST + i * FIELDS
  local id = ARGV[base]
  local key = job_key(id)
  local run_of = nil -- the key whose current run this replaces (see key_record in _lib.lua)
  if outcomes[i] == 'replaced' then
    local record = key_record(key, id)
    if record then -- the new job is the key's current run, and holds the record while it lives
      run_of = redis.call('HGET', key, 'kkey')
      redis.call('PERSIST', record)
    end
    if #zadd > 0 then -- the job may be earlier in this batch: index it first
      redis.call('ZADD', K_DUE, unpack(zadd))
      zadd = {}
    end
    local state = redis.call('HGET', key, 'state')
    if state == 'scheduled' then
      unschedule(key, id)
    elseif state then
      unindex_final(key, id, state)
    end
    redis.call('DEL', key)
  end
  if outcomes[i] ~= 'kept' then
    seq = seq + 1
    local due = due_time(ARGV[base + 2])
    local run_at = fmt(due)
    local profile = profiles[tonumber(ARGV[base + 3])]
    local member = string.format('%016d', seq) .. id
    redis.call('HSET', key,
      'name', profile[1], 'payload', ARGV[base + 1], 'run_at', run_at,
      'state', 'scheduled', 'attempts', 0, 'max_attempts', profile[2],
      'backoff', profile[3], 'misfire', profile[4], 'created_at', profile[5],
      'updated_at', now, 'seq', seq)
    if run_of then
      redis.call('HSET', key, 'kkey', run_of)
    end
    if with_flow then
      set_flow_fields(key, ARGV[base + 4], ARGV[base + 5], ARGV[base + 6])
    end
    local score = due * 1000
    zadd[#zadd + 1] = score
    zadd[#zadd + 1] = member
    if #zadd >= 1000 then
      redis.call('ZADD', K_DUE, unpack(zadd))
      zadd = {}
    end
    if SHADOW_PREFIX ~= '' then
      redis.call('SET', SHADOW_PREFIX .. id, '', 'PX', shadow_ttl(score))
    end
  end
  result[#result + 1] = outcomes[i]
end
if #zadd > 0 then
  redis.call('ZADD', K_DUE, unpack(zadd))
end
result[2] = wake_if_earlier(before)
return result
