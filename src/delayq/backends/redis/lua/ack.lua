-- ack: finish a claimed job as succeeded or skipped (checks the fencing token).
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- ARGV[1..4]: job key prefix, now ("" = TIME), retention, shadow prefix (see _lib.lua)
-- ARGV[5]   job id
-- ARGV[6]   fencing token of the claim
-- ARGV[7]   final state: "succeeded" | "skipped"
-- ARGV[8]   outcome note, or "" for none
-- Returns {1, woke (0/1: a freed slot brought a parked job back)}, or {0, state, token}
-- when the claim is stale.
local id, token, state, outcome = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local key = job_key(id)
local is_stale = stale(key, token)
if is_stale then
  return is_stale
end
return {1, ack_job(key, id, state, outcome, '')}
