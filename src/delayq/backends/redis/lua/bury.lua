-- bury: move a claimed job to the dead-letter set with its error
-- (checks the fencing token).
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- ARGV[1..4]: job key prefix, now ("" = TIME), retention, shadow prefix (see _lib.lua)
-- ARGV[5]   job id
-- ARGV[6]   fencing token of the claim
-- ARGV[7]   error text
-- Returns {1, woke (0/1: a freed slot brought a parked job back)}, or {0, state, token}
-- when the claim is stale.
local id, token, err = ARGV[5], ARGV[6], ARGV[7]
local key = job_key(id)
local is_stale = stale(key, token)
if is_stale then
  return is_stale
end
local woke = leave_running(key, id)
bury(key, id, err)
return {1, woke}
