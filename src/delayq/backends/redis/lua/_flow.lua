-- delayq flow-control helpers: spliced into _lib.lua at its "_flow.lua" line (so
-- they may use the prelude, job_key and schedule, and unschedule may use them); a
-- script carries only the ones it uses. Not a state change by itself.
-- KEYS[1..9] and ARGV[1..4] as in _lib.lua. The flow keys below are derived from
-- the job key prefix ARGV[1] (N = "P:{Q}:", the same hash tag: one cluster slot):
--
-- N:flow          STRING "1" once a job with a key, priority or group, or a limit, was
--                        stored: claims take the flow path from then on
-- N:limits        HASH   pattern -> "<version>:<delayq.flow.Limit.to_json()>"
-- N:limitpat      HASH   the wildcard patterns alone -> their JSON (read whole by a claim)
-- N:prios         ZSET   the priorities that have ready jobs, score -priority
-- N:gq:<p>        ZSET   the groups with ready jobs of priority p, score their last turn
-- N:rq:<p>:<g>    ZSET   the ready jobs of priority p and group g (member as in due,
--                        score run_at in ms: due order, ties FIFO)
-- N:turn          STRING counter of the groups' turns
-- N:held          ZSET   every ready or parked job (member and score as in rq):
--                        what stats and listings add to the due set
-- N:park:<k>      ZSET   jobs of key k waiting for a slot, score -priority, member
--                        "<20-char run_at><due member>" (claim order)
-- N:parked        SET    the keys that have parked jobs
-- N:slots         HASH   key -> live leases of its jobs
-- N:rate          HASH   key -> "<tat> <promised>" (cell rate algorithm; "n" = none)
-- Job hash fields: fkey, prio, grp (only when given); ready / parked ("1" while in
-- N:rq / N:park); throttled (its next allowed time while over its rate, waiting in
-- the due set at that score); slot ("1" while its lease counts in N:slots).
--
-- A job is in exactly one place while scheduled: the due set (not yet due, or
-- throttled), the ready stage (N:rq, due, in claim order) or parked (N:park).

local NS = string.sub(JOB_PREFIX, 1, -5) -- "P:{Q}:job:" -> "P:{Q}:"

local FLOW = nil -- whether the queue uses flow control (read once per call)
local function flow_on()
  if FLOW == nil then
    FLOW = redis.call('EXISTS', NS .. 'flow') == 1
  end
  return FLOW
end

-- Push the shared wake token (at most one in the list).
local function wake_one()
  if redis.call('LLEN', K_WAKE) == 0 then
    redis.call('LPUSH', K_WAKE, '1')
  end
end

-- Put a due job into the ready stage (its priority's level, its group's queue; a
-- group new to the level joins the turn behind the others).
local function ready_add(key, member)
  local f = redis.call('HMGET', key, 'prio', 'grp', 'run_at')
  local p, g = f[1] or '0', f[2] or ''
  local score = tonumber(f[3]) * 1000
  redis.call('ZADD', NS .. 'rq:' .. p .. ':' .. g, score, member)
  redis.call('ZADD', NS .. 'held', score, member)
  redis.call('ZADD', NS .. 'prios', -tonumber(p), p)
  local gq = NS .. 'gq:' .. p
  if not redis.call('ZSCORE', gq, g) then
    redis.call('ZADD', gq, redis.call('INCR', NS .. 'turn'), g)
  end
  redis.call('HSET', key, 'ready', 1)
  redis.call('HDEL', key, 'throttled')
end

-- After member left rq:<p>:<g>: drop the group (and the level) when it emptied, else
-- `pass` sends the group to the back of the turn.
local function ready_settle(p, g, pass)
  local rq = NS .. 'rq:' .. p .. ':' .. g
  local gq = NS .. 'gq:' .. p
  if redis.call('EXISTS', rq) == 0 then
    redis.call('ZREM', gq, g)
    if redis.call('EXISTS', gq) == 0 then
      redis.call('ZREM', NS .. 'prios', p)
    end
  elseif pass then
    redis.call('ZADD', gq, redis.call('INCR', NS .. 'turn'), g)
  end
end

-- Take the next ready job in claim order: the highest priority, the group whose
-- turn it is, its earliest job. Returns its due member, or nil when none is ready.
local function ready_pop()
  while true do
    local p = redis.call('ZRANGE', NS .. 'prios', 0, 0)[1]
    if not p then
      return nil
    end
    local g = redis.call('ZRANGE', NS .. 'gq:' .. p, 0, 0)[1]
    if not g then
      redis.call('ZREM', NS .. 'prios', p) -- an empty level (repaired)
    else
      local rq = NS .. 'rq:' .. p .. ':' .. g
      local member = redis.call('ZRANGE', rq, 0, 0)[1]
      if member then
        redis.call('ZREM', rq, member)
        redis.call('ZREM', NS .. 'held', member)
        ready_settle(p, g, true)
        return member
      end
      ready_settle(p, g, false)
    end
  end
end

-- The park member of a job: its run_at as 20 sortable characters, then its due member.
local function park_member(run_at, member)
  return string.format('%020.3f', tonumber(run_at) * 1000 + 1e15) .. member
end

-- Wait for a slot of key `fkey` (its concurrency limit is reached).
local function park(key, fkey, member, prio, run_at)
  redis.call('ZADD', NS .. 'park:' .. fkey, -tonumber(prio or '0'), park_member(run_at, member))
  redis.call('SADD', NS .. 'parked', fkey)
  redis.call('ZADD', NS .. 'held', tonumber(run_at) * 1000, member)
  redis.call('HSET', key, 'parked', 1)
end

-- Give up to `n` parked jobs of `fkey` their place in the ready stage, in claim
-- order. Returns how many.
local function unpark(fkey, n)
  local parked = NS .. 'park:' .. fkey
  local back = redis.call('ZPOPMIN', parked, n)
  for i = 1, #back, 2 do
    local member = string.sub(back[i], 21)
    local key = job_key(string.sub(member, 17))
    redis.call('HDEL', key, 'parked')
    ready_add(key, member)
  end
  if redis.call('EXISTS', parked) == 0 then
    redis.call('SREM', NS .. 'parked', fkey)
  end
  return #back / 2
end

-- Every parked job back to the ready stage (a limit changed: the next claim decides
-- again). Returns 1 when any came back (a waiter was woken).
local function unpark_all()
  local woke = 0
  for _, fkey in ipairs(redis.call('SMEMBERS', NS .. 'parked')) do
    if unpark(fkey, redis.call('ZCARD', NS .. 'park:' .. fkey)) > 0 then
      woke = 1
    end
  end
  if woke == 1 then
    wake_one()
  end
  return woke
end

-- A glob pattern ("tenant:*") as an anchored Lua pattern.
local function glob_pattern(pattern)
  local escaped = string.gsub(pattern, '[%^%$%(%)%%%.%[%]%+%-%?]', '%%%0')
  return '^' .. string.gsub(escaped, '%*', '.*') .. '$'
end

-- The limit of key `fkey` (cached for the call): its own record, else the most
-- specific matching pattern (the longest literal text, then the greatest pattern),
-- as delayq.flow.pick_limit. A table {conc, count, period, burst}, or false.
local LIMITS = {}
local PATTERNS = nil
local function limit_of(fkey)
  local known = LIMITS[fkey]
  if known ~= nil then
    return known
  end
  local text = redis.call('HGET', NS .. 'limits', fkey)
  if text then
    text = string.match(text, '^%d+:(.*)$')
  else
    if PATTERNS == nil then
      PATTERNS = {}
      local all = redis.call('HGETALL', NS .. 'limitpat')
      for i = 1, #all, 2 do
        local literal = string.gsub(all[i], '%*', '')
        PATTERNS[#PATTERNS + 1] = {all[i], glob_pattern(all[i]), #literal, all[i + 1]}
      end
    end
    local best = nil
    for _, p in ipairs(PATTERNS) do
      if string.find(fkey, p[2]) and (not best or p[3] > best[3]
          or (p[3] == best[3] and p[1] > best[1])) then
        best = p
      end
    end
    text = best and best[4]
  end
  local limit = false
  if text then
    local d = cjson.decode(text)
    limit = {conc = d.concurrency, count = d.rate_count, period = d.rate_period,
      burst = d.burst or 0}
  end
  LIMITS[fkey] = limit
  return limit
end

-- Live leases of key `fkey` (read once per call, then kept here).
local SLOTS = {}
local function slots_of(fkey)
  local n = SLOTS[fkey]
  if n == nil then
    n = tonumber(redis.call('HGET', NS .. 'slots', fkey) or '0')
    SLOTS[fkey] = n
  end
  return n
end

-- One start at NOW under `limit`'s rate (generic cell rate algorithm, as
-- delayq.flow.admit_rate): (true, new tat) or (false, the next allowed time).
local function admit_rate(tat, limit)
  local interval = limit.period / limit.count
  local arrival = NOW
  if tat and tat >= NOW then
    arrival = tat
  end
  local allowed_at = arrival - limit.burst * interval
  if allowed_at > NOW then
    return false, allowed_at
  end
  return true, arrival + interval
end

local function rate_state(fkey)
  local text = redis.call('HGET', NS .. 'rate', fkey)
  if not text then
    return nil, nil
  end
  local tat, promised = string.match(text, '^(%S+) (%S+)$')
  return tonumber(tat), tonumber(promised)
end

local function save_rate(fkey, tat, promised)
  redis.call('HSET', NS .. 'rate', fkey, (tat and fmt(tat) or 'n') .. ' '
    .. (promised and fmt(promised) or 'n'))
end

-- May the ready job `member` of key `fkey` start now? true: its start is recorded
-- (a slot, for every keyed job, so a limit declared later counts the jobs already
-- running; a rate step). false: it was held back, parked at its key's concurrency
-- or given its next allowed time (after those already given to the key's other
-- throttled jobs, so a backlog is spread over the coming slots) in the due set.
local function flow_admit(key, id, member, fkey, prio, run_at)
  local limit = limit_of(fkey)
  if limit then
    if limit.conc and slots_of(fkey) >= limit.conc then
      park(key, fkey, member, prio, run_at)
      return false
    end
    if limit.count then
      local tat, promised = rate_state(fkey)
      local ok, at = admit_rate(tat, limit)
      if not ok then
        if promised and promised > at then
          at = promised
        end
        save_rate(fkey, tat, at + limit.period / limit.count)
        redis.call('HSET', key, 'throttled', fmt(at))
        schedule(key, id, at, false)
        return false
      end
      save_rate(fkey, at, promised)
    end
  end
  SLOTS[fkey] = slots_of(fkey) + 1
  redis.call('HINCRBY', NS .. 'slots', fkey, 1)
  redis.call('HSET', key, 'slot', 1)
  return true
end

-- The most due jobs a claim moves into the ready stage, and the most ready jobs
-- beyond its limit it may hold back (both bound the script's time; a claim that
-- stops early wakes another worker to go on).
local PROMOTE_PER_CLAIM = 1000
local HOLD_PER_CLAIM = 1000

-- The flow path of a claim: move the due jobs into the ready stage, then take up
-- to `limit` in claim order, holding back those their key's limits refuse now.
-- Returns the ids to lease (in order) and whether jobs may be left to claim.
local function flow_pick(limit)
  local due = redis.call('ZRANGEBYSCORE', K_DUE, '-inf', fmt(NOW_MS), 'LIMIT', 0,
    PROMOTE_PER_CLAIM)
  for _, member in ipairs(due) do
    local key = job_key(string.sub(member, 17))
    redis.call('ZREM', K_DUE, member)
    if SHADOW_PREFIX ~= '' then
      redis.call('DEL', SHADOW_PREFIX .. string.sub(member, 17))
    end
    if redis.call('HGET', key, 'state') == 'scheduled' then
      ready_add(key, member)
    end
  end
  local picked = {}
  local seen = 0
  while #picked < limit and seen < limit + HOLD_PER_CLAIM do
    local member = ready_pop()
    if not member then
      break
    end
    seen = seen + 1
    local id = string.sub(member, 17)
    local key = job_key(id)
    redis.call('HDEL', key, 'ready')
    local f = redis.call('HMGET', key, 'state', 'fkey', 'prio', 'run_at')
    if f[1] == 'scheduled' and (not f[2] or flow_admit(key, id, member, f[2], f[3], f[4])) then
      picked[#picked + 1] = id
    end
  end
  return picked, #picked >= limit or seen >= limit + HOLD_PER_CLAIM or #due >= PROMOTE_PER_CLAIM
end

-- The job left RUNNING: free the slot its lease held and give parked jobs of its
-- key that now have room their place back. Returns 1 when some came back (a
-- waiter was woken). Idempotent.
local function free_slot(key)
  if not flow_on() or redis.call('HDEL', key, 'slot') == 0 then
    return 0
  end
  local fkey = redis.call('HGET', key, 'fkey')
  if redis.call('HINCRBY', NS .. 'slots', fkey, -1) <= 0 then
    redis.call('HDEL', NS .. 'slots', fkey)
  end
  local waiting = redis.call('ZCARD', NS .. 'park:' .. fkey)
  if waiting == 0 then
    return 0
  end
  local room = waiting
  local limit = limit_of(fkey)
  if limit and limit.conc then
    room = math.min(waiting, limit.conc - tonumber(redis.call('HGET', NS .. 'slots', fkey) or '0'))
  end
  if room <= 0 then
    return 0
  end
  unpark(fkey, room)
  wake_one()
  return 1
end

-- A scheduled job leaves the ready stage or its key's parked jobs (it is cancelled,
-- rescheduled or replaced); a throttled one forgets its next allowed time.
local function flow_drop(key, member)
  local f = redis.call('HMGET', key, 'ready', 'parked', 'prio', 'grp', 'fkey', 'run_at')
  if f[1] then
    local p, g = f[3] or '0', f[4] or ''
    redis.call('ZREM', NS .. 'rq:' .. p .. ':' .. g, member)
    redis.call('ZREM', NS .. 'held', member)
    ready_settle(p, g, false)
  elseif f[2] then
    local parked = NS .. 'park:' .. f[5]
    redis.call('ZREM', parked, park_member(f[6], member))
    redis.call('ZREM', NS .. 'held', member)
    if redis.call('EXISTS', parked) == 0 then
      redis.call('SREM', NS .. 'parked', f[5])
    end
  end
  redis.call('HDEL', key, 'ready', 'parked', 'throttled')
end
