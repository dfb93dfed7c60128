-- delayq shared prelude: prepended to every script below before it is loaded.
-- It is not a state change by itself. Every script receives the same KEYS and
-- the same first four ARGV, so the prelude can name them once:
--
-- KEYS[1] due        ZSET  member = 16-digit sequence .. job id, score = run_at in ms
-- KEYS[2] running    ZSET  member = job id, score = lease deadline in ms
-- KEYS[3] dead       ZSET  member = job id, score = buried time in ms
-- KEYS[4] seq        STRING counter giving due members their FIFO sequence
-- KEYS[5] token      STRING counter of fencing tokens
-- KEYS[6] wake       LIST  wake-up tokens for workers blocked in BLPOP
-- KEYS[7] succeeded  ZSET  member = job id, score = record expiry in ms
-- KEYS[8] cancelled  ZSET  (same)
-- KEYS[9] skipped    ZSET  (same)
-- ARGV[1] job key prefix: a job's hash is ARGV[1] .. id (same hash tag as KEYS)
-- ARGV[2] now in epoch seconds, or "" to use the server clock (TIME)
-- ARGV[3] "<result_ttl ms> <max finished> <max dead>": finished records are kept that
--         long (<= 0: not kept), and at most that many per final state; dead letters
--         at most that many (0: no cap); past a cap the oldest records go
-- ARGV[4] shadow key prefix for the expiry trigger, or "" when it is off
--
-- Job hashes (and shadow keys) are built from ARGV[1] (ARGV[4]) rather than
-- passed in KEYS because claim cannot know them in advance. They carry the
-- queue's hash tag, so on Redis Cluster they live in the slot of KEYS, the
-- slot the script runs on; Redis 7 lets a script touch an undeclared key of
-- that slot (it refuses one of another slot, which these never are).

local K_DUE, K_RUNNING, K_DEAD = KEYS[1], KEYS[2], KEYS[3]
local K_SEQ, K_TOKEN, K_WAKE = KEYS[4], KEYS[5], KEYS[6]
local K_DONE = {succeeded = KEYS[7], cancelled = KEYS[8], skipped = KEYS[9]}
local JOB_PREFIX = ARGV[1]
local RESULT_TTL_MS, MAX_FINISHED, MAX_DEAD
do
  local ttl, finished, dead = string.match(ARGV[3], '^(%S+) (%S+) (%S+)$')
  RESULT_TTL_MS, MAX_FINISHED, MAX_DEAD = tonumber(ttl), tonumber(finished), tonumber(dead)
end
local SHADOW_PREFIX = ARGV[4]

-- Lua's tostring keeps only 14 significant digits: format floats explicitly.
local function fmt(x)
  return string.format('%.17g', x)
end

local NOW
if ARGV[2] ~= '' then
  NOW = tonumber(ARGV[2])
else
  local t = redis.call('TIME')
  NOW = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local NOW_MS = NOW * 1000

local function job_key(id)
  return JOB_PREFIX .. id
end

-- A due time argument: epoch seconds, or "+<seconds>" for that long after NOW
-- (a relative delay, decided on the server's clock; a negative one means now).
local function due_time(text)
  if string.sub(text, 1, 1) == '+' then
    return NOW + math.max(0, tonumber(string.sub(text, 2)))
  end
  return tonumber(text)
end

-- The PX of a job's shadow key (the expiry trigger) for a due time in ms: an
-- integer, at least 1 and at most SHADOW_MAX_MS. A job due later gets a shadow
-- that expires early: only a spurious wake-up (the due set decides), where a PX
-- beyond what SET accepts would fail the script after earlier writes.
local SHADOW_MAX_MS = 100 * 365 * 86400 * 1000
local function shadow_ttl(score)
  local ms = math.ceil(score - NOW_MS)
  if ms ~= ms or ms > SHADOW_MAX_MS then -- NaN or too far
    ms = SHADOW_MAX_MS
  end
  return string.format('%d', math.max(1, ms))
end

-- Put job `id` in the due set at `run_at` (seconds). Ties are claimed in
-- enqueue order: the member starts with the job's fixed-width sequence number
-- (ZSET ties are ordered by member). A job keeps its sequence number when it is
-- retried, rescheduled or requeued; `fresh` gives it a new one (enqueue).
local function schedule(key, id, run_at, fresh)
  local seq = (not fresh) and redis.call('HGET', key, 'seq')
  if not seq then
    seq = redis.call('INCR', K_SEQ)
    redis.call('HSET', key, 'seq', seq)
  end
  local member = string.format('%016d', tonumber(seq)) .. id
  local score = run_at * 1000
  redis.call('ZADD', K_DUE, score, member)
  if SHADOW_PREFIX ~= '' then
    redis.call('SET', SHADOW_PREFIX .. id, '', 'PX', shadow_ttl(score))
  end
  return member
end

-- (the flow-control helpers of _flow.lua are spliced in here)

-- Take a scheduled job out of the due set, or out of the ready stage or its key's
-- parked jobs (its member is its sequence number and id).
local function unschedule(key, id)
  local seq = redis.call('HGET', key, 'seq')
  if seq then
    local member = string.format('%016d', tonumber(seq)) .. id
    redis.call('ZREM', K_DUE, member)
    if flow_on() then
      flow_drop(key, member)
    end
  end
  if SHADOW_PREFIX ~= '' then
    redis.call('DEL', SHADOW_PREFIX .. id)
  end
end

-- The score of the head of the due set (its run_at in ms), or nil when empty.
local function head_score()
  return tonumber(redis.call('ZRANGE', K_DUE, 0, 0, 'WITHSCORES')[2])
end

-- Wake one blocked worker when the head of the due set became earlier than
-- `before` (the head score before the change, or nil). The list holds at most
-- one token: a token nobody takes costs one spurious wake-up.
local function wake_if_earlier(before)
  local after = head_score()
  if after and (not before or after < before) then
    redis.call('LPUSH', K_WAKE, '1')
    redis.call('LTRIM', K_WAKE, 0, 0)
    return 1
  end
  return 0
end

-- A new job's flow-control fields, given as script arguments ("" / "0": none).
local function set_flow_fields(key, fkey, prio, grp)
  if fkey ~= '' then
    redis.call('HSET', key, 'fkey', fkey)
  end
  if prio ~= '0' then
    redis.call('HSET', key, 'prio', prio)
  end
  if grp ~= '' then
    redis.call('HSET', key, 'grp', grp)
  end
end

-- Keyed calls (keyed.lua) keep one record per key, NS .. "keyed:" .. key, that names
-- the key's current job; every run's hash names its key (field kkey). The record
-- lives as long as its current job: once that job finishes it expires with it
-- (result_ttl), and it goes when the job is dropped (max_finished, max_dead,
-- purge_dead), but never before the key's throttle window ends.
-- The record of the key whose current job is `id` (hash `key`), or nil.
local function key_record(key, id)
  local name = redis.call('HGET', key, 'kkey')
  if name then
    local record = NS .. 'keyed:' .. name
    if redis.call('HGET', record, 'job') == id then
      return record
    end
  end
  return nil
end

-- Job `id` (hash `key`) is kept `ms` more (0: it goes now): so is its key's record,
-- or until the key's throttle window ends when that is later.
local function key_expires(key, id, ms)
  local record = key_record(key, id)
  if record then
    local left = tonumber(redis.call('HGET', record, 'window_end')) * 1000 - NOW_MS
    ms = math.max(ms, left)
    if ms > 0 then
      redis.call('PEXPIRE', record, math.ceil(ms))
    else
      redis.call('DEL', record)
    end
  end
end

-- The state of job `id`, or nil when it does not exist. A finished record
-- past its result_ttl counts as gone (and is deleted) even before Redis expires
-- it, so an injected test clock sees the same rule as the server clock.
local function live_state(key, id)
  local state = redis.call('HGET', key, 'state')
  if state and K_DONE[state] then
    local expiry = redis.call('ZSCORE', K_DONE[state], id)
      or redis.call('ZSCORE', K_DONE[state] .. ':compact', id)
    if not expiry or tonumber(expiry) <= NOW_MS then
      redis.call('ZREM', K_DONE[state], id)
      redis.call('ZREM', K_DONE[state] .. ':compact', id)
      key_expires(key, id, 0)
      redis.call('DEL', key)
      return nil
    end
  end
  return state
end

-- Epoch seconds as UTC ISO 8601 with milliseconds, like Python's
-- datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").
local function format_time(epoch)
  local us = math.floor(epoch * 1000000 + 0.5)
  local secs = math.floor(us / 1000000)
  local ms = math.floor((us % 1000000) / 1000)
  local days = math.floor(secs / 86400)
  local rem = secs % 86400
  -- civil_from_days (H. Hinnant)
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then
    y = y + 1
  end
  return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%03d+00:00', y, m, d,
    math.floor(rem / 3600), math.floor((rem % 3600) / 60), rem % 60, ms)
end

-- Keep the index `index` of final state `state` within `cap` records (0: no cap)
-- by deleting its oldest ones, at most two per call: memory stays bounded
-- whatever the rate, and no call does more than a few steps of catching up.
local function trim_index(index, state, cap)
  if cap <= 0 then
    return
  end
  local over = redis.call('ZCARD', index) - cap
  if over <= 0 then
    return
  end
  local oldest = redis.call('ZPOPMIN', index, math.min(over, 2))
  for i = 1, #oldest, 2 do
    local key = job_key(oldest[i])
    if redis.call('HGET', key, 'state') == state then
      key_expires(key, oldest[i], 0)
      redis.call('DEL', key)
    end
  end
end

-- The finished records past the newest MAX_FINISHED of a state are not dropped
-- before their result_ttl: they are kept compact (the payload and the error text
-- dropped, field compact = 1) in a second index, K_DONE[state] .. ":compact",
-- scored by expiry like the first and capped at COMPACT_FACTOR x MAX_FINISHED, so
-- get, cancel, on_conflict and keyed calls answer for an id for the whole window
-- on a busy queue (a dedup window: a kept id is never scheduled again), with memory
-- per compact record stated in the README. Past that cap the oldest go.
local COMPACT_FACTOR = 10
local COMPACT_FIELDS = {'name', 'state', 'run_at', 'attempts', 'max_attempts', 'misfire',
  'created_at', 'updated_at', 'outcome', 'kkey', 'fkey', 'prio', 'grp', 'result'}
local function trim_finished(state)
  if MAX_FINISHED <= 0 then
    return
  end
  local index, compact = K_DONE[state], K_DONE[state] .. ':compact'
  local over = redis.call('ZCARD', index) - MAX_FINISHED
  if over > 0 then
    local oldest = redis.call('ZPOPMIN', index, math.min(over, 2))
    for i = 1, #oldest, 2 do
      local id, expiry = oldest[i], tonumber(oldest[i + 1])
      local key = job_key(id)
      if redis.call('HGET', key, 'state') == state then
        if expiry > NOW_MS then
          -- written again with only the small fields (a hash of small values is
          -- a listpack: a fraction of the memory of the record it replaces)
          local f = redis.call('HMGET', key, unpack(COMPACT_FIELDS))
          redis.call('DEL', key)
          local fields = {'payload', 'null', 'backoff', '{}', 'compact', '1'}
          for j, name in ipairs(COMPACT_FIELDS) do
            if f[j] then
              fields[#fields + 1] = name
              fields[#fields + 1] = f[j]
            end
          end
          redis.call('HSET', key, unpack(fields))
          redis.call('PEXPIRE', key, math.max(1, math.ceil(expiry - NOW_MS)))
          redis.call('ZADD', compact, expiry, id)
        else
          key_expires(key, id, 0)
          redis.call('DEL', key)
        end
      end
    end
  end
  over = redis.call('ZCARD', compact) - MAX_FINISHED * COMPACT_FACTOR
  if over > 0 then
    local oldest = redis.call('ZPOPMIN', compact, math.min(over, 2))
    for i = 1, #oldest, 2 do
      local key = job_key(oldest[i])
      if redis.call('HGET', key, 'state') == state and redis.call('HGET', key, 'compact') then
        key_expires(key, oldest[i], 0)
        redis.call('DEL', key)
      end
    end
  end
end

-- Record a final state (succeeded / cancelled / skipped); the record expires.
local function finish(key, id, state)
  if RESULT_TTL_MS <= 0 then
    key_expires(key, id, 0)
    redis.call('DEL', key)
    return
  end
  redis.call('ZADD', K_DONE[state], NOW_MS + RESULT_TTL_MS, id)
  redis.call('PEXPIRE', key, math.ceil(RESULT_TTL_MS))
  key_expires(key, id, RESULT_TTL_MS)
  trim_finished(state)
end

-- Move a job to the dead-letter set (kept until purged, requeued or past MAX_DEAD).
local function bury(key, id, err)
  redis.call('HSET', key, 'state', 'dead', 'last_error', err, 'updated_at', fmt(NOW))
  redis.call('HDEL', key, 'lease_until')
  redis.call('ZADD', K_DEAD, NOW_MS, id)
  trim_index(K_DEAD, 'dead', MAX_DEAD)
end

-- nil when `token` is the job's current claim, else the reply a stale claim
-- gets: {0, state or "", token or ""} (for the StaleClaim message).
local function stale(key, token)
  local fields = redis.call('HMGET', key, 'state', 'token')
  if fields[1] == 'running' and fields[2] == token then
    return nil
  end
  return {0, fields[1] or '', fields[2] or ''}
end

-- Fencing tokens: `count` tokens larger than every token handed out before,
-- also after Redis lost writes (a restart without persistence, an RDB or AOF
-- restore, a failover to a replica that missed the last writes). A rolled-back
-- counter alone would repeat tokens; so the first is max(last + 1, server time
-- in microseconds): a token never runs ahead of the clock by more than the
-- tokens issued per microsecond (a claim takes longer than that per job), and
-- the clock has moved on past every lost token by the time a restarted server
-- answers. Returns the first (a Lua number; format it with %d: tostring would
-- round it) and stores the last. Integers stay exact in a double until 2^53 us
-- (the year 2255).
local function new_tokens(count)
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local first = math.max(tonumber(redis.call('GET', K_TOKEN) or '0') + 1, us)
  redis.call('SET', K_TOKEN, string.format('%d', first + count - 1))
  return first
end

-- The job's lease ends (it leaves the running set): its key's slot frees. Returns 1
-- when that woke a waiter (a parked job of the key came back).
local function leave_running(key, id)
  redis.call('ZREM', K_RUNNING, id)
  return free_slot(key)
end

-- The most leases of one job that may run out with no recorded start before it is
-- buried (mirrors MAX_UNSTARTED in _common.py; a test checks they agree).
local MAX_UNSTARTED = 5

-- The fields recover_lease reads (HMGET key, unpack(LEASE_FIELDS)).
local LEASE_FIELDS = {'state', 'attempts', 'max_attempts', 'lease_until', 'started', 'unstarted'}

-- Return an expired lease to the due set (due from the moment it ran out), or
-- bury the job when it has used all its attempts. `f` is its HMGET of
-- LEASE_FIELDS. A lease whose handler was never recorded as started (no
-- `started` field) is not an attempt: the attempt is given back and the job is
-- due again at its own run_at, or buried at MAX_UNSTARTED such expiries.
-- Returns the job's new state. Used by claim (which recovers expired leases
-- first) and by cancel and reschedule: a job whose lease ran out is not
-- running, whatever its hash still says. The messages mirror
-- lease_expired_error / lease_expired_note / unstarted_expired_error /
-- unstarted_expired_note in _common.py.
local function recover_lease(key, id, f)
  leave_running(key, id)
  local attempts, max_attempts = tonumber(f[2]), tonumber(f[3])
  local at = format_time(tonumber(f[4]))
  if not f[5] then
    local unstarted = (tonumber(f[6]) or 0) + 1
    redis.call('HSET', key, 'attempts', math.max(0, attempts - 1), 'unstarted', unstarted)
    if unstarted >= MAX_UNSTARTED then
      bury(key, id, string.format('lease expired at %s, the %dth time with no recorded start '
        .. '(MAX_UNSTARTED=%d): a job that stops its worker before it starts? Requeue it '
        .. 'once that is fixed', at, unstarted, MAX_UNSTARTED))
      return 'dead'
    end
    local note = string.format('lease expired at %s before the handler was recorded as '
      .. 'started: not an attempt; due again (the worker holding it stopped, paused or lost '
      .. 'the store)', at)
    redis.call('HSET', key, 'state', 'scheduled', 'last_error', note, 'updated_at', fmt(NOW))
    redis.call('HDEL', key, 'lease_until')
    schedule(key, id, tonumber(redis.call('HGET', key, 'run_at')), false)
    return 'scheduled'
  end
  if attempts >= max_attempts then
    bury(key, id, string.format('lease expired at %s after %d attempts (max_attempts=%d): '
      .. 'the worker holding it stopped or hung', at, attempts, max_attempts))
    return 'dead'
  end
  -- Due again from the moment its lease ran out: lateness (and the misfire
  -- policy) is measured from there, not from the first due time.
  local note = string.format('lease expired at %s during attempt %d: the worker holding '
    .. 'it stopped or hung; returned to the due set', at, attempts)
  redis.call('HSET', key, 'state', 'scheduled', 'run_at', f[4], 'last_error', note,
    'updated_at', fmt(NOW))
  redis.call('HDEL', key, 'lease_until')
  schedule(key, id, tonumber(f[4]), false)
  return 'scheduled'
end

-- live_state, with a running job whose lease has expired recovered first (see
-- recover_lease): what cancel and reschedule act on.
local function settled_state(key, id)
  local state = live_state(key, id)
  if state == 'running' then
    local f = redis.call('HMGET', key, unpack(LEASE_FIELDS))
    if tonumber(f[4]) * 1000 <= NOW_MS then
      return recover_lease(key, id, f)
    end
  end
  return state
end

-- Finish a claimed job as succeeded or skipped with an optional note and an
-- optional result (JSON text, kept with the finished record); "" = none.
-- Returns 1 when a waiter was woken (see leave_running).
local function ack_job(key, id, state, outcome, result)
  local woke = leave_running(key, id)
  redis.call('HSET', key, 'state', state, 'updated_at', fmt(NOW))
  redis.call('HDEL', key, 'lease_until')
  if outcome ~= '' then
    redis.call('HSET', key, 'outcome', outcome)
  else
    redis.call('HDEL', key, 'outcome')
  end
  if result ~= '' then
    redis.call('HSET', key, 'result', result)
    -- Tell result() waiters in other processes (channel P:{Q}:done; JOB_PREFIX is
    -- P:{Q}:job:). A hint: a waiter that misses it reads the job after its pause.
    redis.call('PUBLISH', string.sub(JOB_PREFIX, 1, -5) .. 'done', id)
  else
    redis.call('HDEL', key, 'result')
  end
  finish(key, id, state)
  return woke
end

-- Return a claimed job to the due set at `run_at` (text, epoch seconds) with its error.
-- Returns 1 when a waiter was woken (see leave_running).
local function retry_job(key, id, run_at, err)
  local woke = leave_running(key, id)
  redis.call('HSET', key, 'state', 'scheduled', 'run_at', run_at, 'last_error', err,
    'updated_at', fmt(NOW))
  redis.call('HDEL', key, 'lease_until')
  schedule(key, id, tonumber(run_at), false)
  return woke
end

local function is_final(state)
  return state == 'succeeded' or state == 'cancelled' or state == 'skipped' or state == 'dead'
end

-- Forget where a finished job was indexed (before it is replaced or requeued).
local function unindex_final(key, id, state)
  if state == 'dead' then
    redis.call('ZREM', K_DEAD, id)
  elseif K_DONE[state] then
    redis.call('ZREM', K_DONE[state], id)
    redis.call('ZREM', K_DONE[state] .. ':compact', id)
    redis.call('HDEL', key, 'compact')
  end
  redis.call('PERSIST', key)
end

-- Claim up to `limit` due jobs for `lease` seconds (see claim.lua for the reply).
-- REQUEST is the call's request key: when it holds a record, the call is the retry
-- of one whose reply was lost and returns that call's claims; a claim that took
-- jobs records itself there for `replay_ms` (0: no record).
--
-- First, expired leases go back to the due set (due at once), or to the
-- dead-letter set when the job has used all its attempts: no reaper process is
-- needed. Then due jobs are claimed in (run_at, enqueue order), or, on a queue
-- that uses flow control, in claim order with the limits applied (flow_pick). When the claim
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
local function claim_jobs(REQUEST, limit, lease, max_recover, replay_ms, max_purge)
  local now = fmt(NOW)

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
  for _, done in pairs(K_DONE) do
    for _, k in ipairs({done, done .. ':compact'}) do
      local old = redis.call('ZRANGEBYSCORE', k, '-inf', fmt(NOW_MS), 'LIMIT', 0, max_purge)
      if #old > 0 then
        redis.call('ZREM', k, unpack(old))
      end
    end
  end

  local expired = redis.call('ZRANGEBYSCORE', K_RUNNING, '-inf', fmt(NOW_MS), 'LIMIT', 0, max_recover)
  for _, id in ipairs(expired) do
    local key = job_key(id)
    local f = redis.call('HMGET', key, unpack(LEASE_FIELDS))
    if f[1] == 'running' then
      recover_lease(key, id, f)
    else
      redis.call('ZREM', K_RUNNING, id)
    end
  end

  local lease_until = NOW + lease
  local lease_until_s = fmt(lease_until)
  local result = {now, lease_until_s, '', 0}
  local picked, full
  if flow_on() then
    picked, full = flow_pick(limit)
  else
    local members = redis.call('ZRANGEBYSCORE', K_DUE, '-inf', fmt(NOW_MS), 'LIMIT', 0, limit)
    picked, full = {}, #members == limit
    for _, member in ipairs(members) do
      local id = string.sub(member, 17)
      redis.call('ZREM', K_DUE, member)
      if SHADOW_PREFIX ~= '' then
        redis.call('DEL', SHADOW_PREFIX .. id)
      end
      if redis.call('HGET', job_key(id), 'state') == 'scheduled' then
        picked[#picked + 1] = id
      end
    end
  end
  local lease_before = nil -- the earliest lease deadline before this claim (ms)
  local first_token = 0
  if #picked > 0 then
    lease_before = tonumber(redis.call('ZRANGE', K_RUNNING, 0, 0, 'WITHSCORES')[2])
    first_token = new_tokens(#picked)
  end
  local claimed = 0
  for _, id in ipairs(picked) do
    local key = job_key(id)
    local token = string.format('%d', first_token + claimed)
    redis.call('HINCRBY', key, 'attempts', 1)
    redis.call('HDEL', key, 'started')
    redis.call('HSET', key, 'state', 'running', 'token', token, 'lease_until', lease_until_s,
      'updated_at', now)
    redis.call('ZADD', K_RUNNING, lease_until * 1000, id)
    claimed = claimed + 1
    result[#result + 1] = id
    result[#result + 1] = redis.call('HGETALL', key)
  end

  if claimed > 0 and replay_ms > 0 then
    redis.call('SET', REQUEST, string.format('%s %s %d %d', now, lease_until_s, first_token,
      first_token + claimed - 1), 'PX', replay_ms)
  end

  local head = redis.call('ZRANGE', K_DUE, 0, 0, 'WITHSCORES')
  local next_ms = tonumber(head[2])
  if flow_on() and redis.call('EXISTS', NS .. 'prios') == 1 then
    next_ms = NOW_MS -- ready jobs are left: due now
  end
  local lease_ms = lease_until * 1000
  local wake = false
  if full and next_ms then
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
end

-- Finish a batch of n claims whose entries start at ARGV[first] (see complete.lua
-- for the entry layout and the reply).
local function complete_batch(n, first)
  local FIELDS = 5
  -- The head of the due set before the first retry (acks and buries do not move it).
  local before = nil
  local retried = false
  local woke = 0 -- a freed slot brought a parked job back
  local result = {0}
  for i = 0, n - 1 do
    local base = first + i * FIELDS
    local id, token, state = ARGV[base], ARGV[base + 1], ARGV[base + 2]
    local key = job_key(id)
    local is_stale = stale(key, token)
    if is_stale then
      result[#result + 1] = is_stale
    else
      if state == 'release' or state == 'release_note' then
        -- Back to its original run_at (its place in the due order) or the one given,
        -- the attempt given back.
        if not retried then
          before = head_score()
          retried = true
        end
        if leave_running(key, id) == 1 then
          woke = 1
        end
        redis.call('HINCRBY', key, 'attempts', -1)
        redis.call('HSET', key, 'state', 'scheduled', 'updated_at', fmt(NOW))
        if state == 'release_note' then
          redis.call('HSET', key, 'last_error', ARGV[base + 4])
        else
          -- A real error of an earlier attempt stays; the note only fills an empty one.
          redis.call('HSETNX', key, 'last_error', ARGV[base + 4])
        end
        local run_at = tonumber(redis.call('HGET', key, 'run_at'))
        if ARGV[base + 3] ~= '' then
          run_at = tonumber(ARGV[base + 3])
          redis.call('HSET', key, 'run_at', fmt(run_at))
        end
        redis.call('HDEL', key, 'lease_until')
        schedule(key, id, run_at, false)
      elseif state == 'scheduled' then
        if not retried then
          before = head_score()
          retried = true
        end
        if retry_job(key, id, ARGV[base + 3], ARGV[base + 4]) == 1 then
          woke = 1
        end
      elseif state == 'dead' then
        if leave_running(key, id) == 1 then
          woke = 1
        end
        bury(key, id, ARGV[base + 4])
      elseif ack_job(key, id, state, ARGV[base + 4], ARGV[base + 3]) == 1 then
        woke = 1
      end
      result[#result + 1] = {1}
    end
  end
  if retried then
    result[1] = wake_if_earlier(before)
  end
  if woke == 1 then
    result[1] = 1
  end
  return result
end

-- ---------------------------------------------------------------------------
