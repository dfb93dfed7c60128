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
-- ARGV[3] result_ttl in ms: how long finished records are kept (<= 0: not kept)
-- ARGV[4] shadow key prefix for the expiry trigger, or "" when it is off
--
-- Job hashes are built from ARGV[1] rather than passed in KEYS because claim
-- cannot know them in advance; they carry the queue's hash tag, so on Redis
-- Cluster they live in the same slot as KEYS.

local K_DUE, K_RUNNING, K_DEAD = KEYS[1], KEYS[2], KEYS[3]
local K_SEQ, K_TOKEN, K_WAKE = KEYS[4], KEYS[5], KEYS[6]
local K_DONE = {succeeded = KEYS[7], cancelled = KEYS[8], skipped = KEYS[9]}
local JOB_PREFIX = ARGV[1]
local RESULT_TTL_MS = tonumber(ARGV[3])
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

-- Take a scheduled job out of the due set (its member is its sequence number and id).
local function unschedule(key, id)
  local seq = redis.call('HGET', key, 'seq')
  if seq then
    redis.call('ZREM', K_DUE, string.format('%016d', tonumber(seq)) .. id)
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

-- The state of job `id`, or nil when it does not exist. A finished record
-- past its result_ttl counts as gone (and is deleted) even before Redis expires
-- it, so an injected test clock sees the same rule as the server clock.
local function live_state(key, id)
  local state = redis.call('HGET', key, 'state')
  if state and K_DONE[state] then
    local expiry = redis.call('ZSCORE', K_DONE[state], id)
    if not expiry or tonumber(expiry) <= NOW_MS then
      redis.call('ZREM', K_DONE[state], id)
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

-- Record a final state (succeeded / cancelled / skipped); the record expires.
local function finish(key, id, state)
  if RESULT_TTL_MS <= 0 then
    redis.call('DEL', key)
    return
  end
  redis.call('ZADD', K_DONE[state], NOW_MS + RESULT_TTL_MS, id)
  redis.call('PEXPIRE', key, math.ceil(RESULT_TTL_MS))
end

-- Move a job to the dead-letter set (kept until purged or requeued).
local function bury(key, id, err)
  redis.call('HSET', key, 'state', 'dead', 'last_error', err, 'updated_at', fmt(NOW))
  redis.call('HDEL', key, 'lease_until')
  redis.call('ZADD', K_DEAD, NOW_MS, id)
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

-- Return an expired lease to the due set (due from the moment it ran out), or
-- bury the job when it has used all its attempts. `f` is its HMGET of state,
-- attempts, max_attempts, lease_until. Returns the job's new state. Used by
-- claim (which recovers expired leases first) and by cancel and reschedule: a
-- job whose lease ran out is not running, whatever its hash still says.
-- The messages mirror lease_expired_error / lease_expired_note in _common.py.
local function recover_lease(key, id, f)
  redis.call('ZREM', K_RUNNING, id)
  local attempts, max_attempts = tonumber(f[2]), tonumber(f[3])
  local at = format_time(tonumber(f[4]))
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
    local f = redis.call('HMGET', key, 'state', 'attempts', 'max_attempts', 'lease_until')
    if tonumber(f[4]) * 1000 <= NOW_MS then
      return recover_lease(key, id, f)
    end
  end
  return state
end

-- Finish a claimed job as succeeded or skipped with an optional note ("" = none).
local function ack_job(key, id, state, outcome)
  redis.call('ZREM', K_RUNNING, id)
  redis.call('HSET', key, 'state', state, 'updated_at', fmt(NOW))
  redis.call('HDEL', key, 'lease_until')
  if outcome ~= '' then
    redis.call('HSET', key, 'outcome', outcome)
  else
    redis.call('HDEL', key, 'outcome')
  end
  finish(key, id, state)
end

-- Return a claimed job to the due set at `run_at` (text, epoch seconds) with its error.
local function retry_job(key, id, run_at, err)
  redis.call('ZREM', K_RUNNING, id)
  redis.call('HSET', key, 'state', 'scheduled', 'run_at', run_at, 'last_error', err,
    'updated_at', fmt(NOW))
  redis.call('HDEL', key, 'lease_until')
  schedule(key, id, tonumber(run_at), false)
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
  end
  redis.call('PERSIST', key)
end

-- ---------------------------------------------------------------------------
