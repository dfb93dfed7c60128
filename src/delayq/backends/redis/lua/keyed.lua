-- keyed: one keyed call (debounce, throttle, unique, append), decided and stored
-- atomically. A port of delayq.keyed.decide (keep the two in step) plus the writes
-- the memory and SQLite stores make for its decision.
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- KEYS[10]  the key's record, P:{Q}:keyed:<key> (a HASH, see key_gone in _lib.lua):
--           job (its current job's id), mode, runs, first_at, window_end, extended,
--           items, calls (the fields of delayq.keyed.KeyState)
-- ARGV[1..4]: job key prefix, now ("" = TIME), retention, shadow prefix (see _lib.lua)
-- ARGV[5]   the key       ARGV[6] payload (JSON)   ARGV[7] due: epoch s or "+<delay>"
-- ARGV[8..11] name, max_attempts, backoff (JSON), misfire
-- ARGV[12..14] flow key ("" = none), priority ("0" = default), group ("" = none)
-- ARGV[15]  mode: "debounce" | "throttle" | "unique" | "append"
-- ARGV[16]  the policy as text (KeyPolicy.describe())
-- ARGV[17]  max_wait | window | unique seconds | max_items
-- ARGV[18]  throttle: "1" = trailing; unique: "until_finished" | "until_started" | "seconds"
-- ARGV[19]  unique: "1" = a held key is a conflict (on_conflict="reject")
-- Returns {outcome, job id, run_at, woke (0/1)}, or {"conflict", "held" | "exists", job id,
-- state} when nothing was written.
local K_KEY = KEYS[10]
local key_name, payload, due = ARGV[5], ARGV[6], due_time(ARGV[7])
local mode, desc, num, flag = ARGV[15], ARGV[16], tonumber(ARGV[17]), ARGV[18]

local function run_id(runs)
  if runs <= 1 then
    return key_name
  end
  return key_name .. '#' .. string.format('%d', runs)
end

-- The key's record and its current job (nil: never seen / gone).
local st, cur = nil, nil
local r = redis.call('HMGET', K_KEY, 'runs', 'first_at', 'window_end', 'extended', 'items',
  'calls', 'mode')
if r[1] then
  st = {runs = tonumber(r[1]), first_at = tonumber(r[2]), window_end = tonumber(r[3]),
        extended = tonumber(r[4]), items = tonumber(r[5]), calls = tonumber(r[6]), mode = r[7]}
  st.job = run_id(st.runs)
  local ckey = job_key(st.job)
  local state = live_state(ckey, st.job)
  if state then
    local f = redis.call('HMGET', ckey, 'attempts', 'run_at')
    cur = {state = state, attempts = tonumber(f[1]), run_at = tonumber(f[2])}
  elseif st.window_end <= NOW then
    st = nil -- its job was purged and no throttle window is left: the record went with it
  end
end

local open = cur ~= nil and cur.state == 'scheduled' and cur.attempts == 0
local live = cur ~= nil and (cur.state == 'scheduled' or cur.state == 'running')

-- The decision: outcome, the record to store, the job acted on, its due time, and
-- the write: "create" | "update" (due time and payload) | "append" | "append_new" | nil.
local outcome, new, job, run_at, write

local function copy(changes)
  local t = {}
  for k, v in pairs(st) do
    t[k] = v
  end
  t.mode = desc
  t.calls = st.calls + 1
  for k, v in pairs(changes) do
    t[k] = v
  end
  return t
end

local function create(at, window_end, items)
  local runs = st and st.runs + 1 or 1
  new = {mode = desc, runs = runs, first_at = NOW, window_end = window_end or 0,
         extended = 0, items = items or 0, calls = 1}
  outcome, job, run_at, write = 'created', run_id(runs), at, 'create'
end

if mode == 'debounce' then
  if st and open then
    local cap = st.first_at + num
    run_at = math.min(due, cap)
    outcome = due > cap and 'capped' or 'extended'
    new, job, write = copy({extended = st.extended + 1}), st.job, 'update'
  else
    create(math.min(due, NOW + num))
  end
elseif mode == 'throttle' then
  local trailing = flag == '1'
  if trailing and st and cur and st.window_end <= NOW and NOW < st.window_end + num
      and cur.run_at >= st.window_end then
    st.window_end = st.window_end + num -- the trailing run opened the window NOW is in
  end
  if not st or NOW >= st.window_end then
    create(due, NOW + num)
  elseif not trailing then
    outcome, new, job = 'dropped', copy({}), st.job
    run_at = cur and cur.run_at or st.window_end
  elseif open and cur.run_at >= st.window_end then
    outcome, new, job, run_at, write = 'folded', copy({}), st.job, st.window_end, 'update'
  else
    create(st.window_end, st.window_end)
    outcome = 'folded'
  end
elseif mode == 'unique' then
  local holds = false
  if st and cur then
    if flag == 'until_finished' then
      holds = live
    elseif flag == 'until_started' then
      holds = open
    else
      holds = NOW < st.first_at + num
    end
  end
  if holds then
    if ARGV[19] == '1' then
      return {'conflict', 'held', st.job, cur.state}
    end
    -- a kept call leaves the record's mode as it was
    outcome, new, job, run_at = 'kept', copy({mode = st.mode}), st.job, cur.run_at
  else
    create(due)
  end
elseif st and open and st.items > 0 and st.items < num then -- onto an append batch only
  outcome, new, job, run_at = 'appended', copy({items = st.items + 1}), st.job, cur.run_at
  write = 'append'
else
  create(due, nil, 1)
  write = 'append_new'
end

local key = job_key(job)
local changed, before = false, nil -- whether the due set changed, and its head before
if write == 'create' or write == 'append_new' then
  local state = live_state(key, job)
  while state do
    -- another record holds this id (an earlier run of a released key, a dead letter
    -- or one still running, or a plain job): take the next id, never overwrite it
    new.runs = new.runs + 1
    job = run_id(new.runs)
    key = job_key(job)
    state = live_state(key, job)
  end
  if state == 'scheduled' or state == 'running' then
    return {'conflict', 'exists', job, state}
  end
  changed, before = true, head_score()
  if write == 'append_new' then
    payload = '[' .. payload .. ']'
  end
  local now = fmt(NOW)
  redis.call('HSET', key, 'name', ARGV[8], 'payload', payload, 'run_at', fmt(run_at),
    'state', 'scheduled', 'attempts', 0, 'max_attempts', ARGV[9], 'backoff', ARGV[10],
    'misfire', ARGV[11], 'created_at', now, 'updated_at', now, 'kkey', key_name)
  local fkey, prio, grp = ARGV[12], ARGV[13], ARGV[14]
  if fkey ~= '' or prio ~= '0' or grp ~= '' then
    redis.call('SET', NS .. 'flow', '1')
    set_flow_fields(key, fkey, prio, grp)
  end
  schedule(key, job, run_at, true)
  redis.call('PERSIST', K_KEY) -- a new run holds the record (see key_finished)
elseif write == 'update' then
  changed, before = true, head_score()
  unschedule(key, job)
  redis.call('HSET', key, 'payload', payload, 'run_at', fmt(run_at), 'updated_at', fmt(NOW),
    'kkey', key_name) -- (a job put there by a plain enqueue becomes the key's run)
  schedule(key, job, run_at, false)
elseif write == 'append' then
  local old = redis.call('HGET', key, 'payload')
  local joined = '[' .. payload .. ']'
  if old ~= '[]' then
    joined = string.sub(old, 1, -2) .. ',' .. payload .. ']'
  end
  redis.call('HSET', key, 'payload', joined, 'updated_at', fmt(NOW), 'kkey', key_name)
end

redis.call('HSET', K_KEY, 'job', job, 'mode', new.mode, 'runs', new.runs,
  'first_at', fmt(new.first_at), 'window_end', fmt(new.window_end), 'extended', new.extended,
  'items', new.items, 'calls', new.calls)
local woke = 0
if changed then -- (an empty due set has no head: before is nil, and any head is earlier)
  woke = wake_if_earlier(before)
end
return {outcome, job, fmt(run_at), woke}
