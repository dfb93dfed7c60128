-- retry: return a claimed job to the due set at run_at, recording its error
-- (checks the fencing token).
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- ARGV[1..4]: job key prefix, now ("" = TIME), retention, shadow prefix (see _lib.lua)
-- ARGV[5]   job id
-- ARGV[6]   fencing token of the claim
-- ARGV[7]   run_at in epoch seconds
-- ARGV[8]   error text
-- Returns {1, woke (0/1)}, or {0, state, token} when the claim is stale.
local id, token, run_at, err = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local key = job_key(id)
local is_stale = stale(key, token)
if is_stale then
  return is_stale
end
local before = head_score()
local woke = retry_job(key, id, run_at, err)
return {1, math.max(woke, wake_if_earlier(before))}
