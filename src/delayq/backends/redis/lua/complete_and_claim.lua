-- complete_and_claim: finish a batch of claims, then claim the next due jobs, as one
-- script (a busy worker records its results and refills its slots in one round trip).
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- KEYS[10]  a fresh claim request key (no record is kept: the call is not retried,
--           because its completions would then be reported stale)
-- ARGV[1..4]: job key prefix, now ("" = TIME), retention, shadow prefix (see _lib.lua)
-- ARGV[5..9]: limit (0: claim nothing), lease in seconds, most expired leases to recover,
--           replay ms (0), most expired finished records to drop (as in claim.lua)
-- ARGV[10]  n, the number of entries; then 5 fields per entry from ARGV[11] (as in
--           complete.lua)
-- Returns {complete's reply, claim's reply or {} when limit is 0}.

local done = complete_batch(tonumber(ARGV[10]), 11)
local limit = tonumber(ARGV[5])
if limit <= 0 then
  return {done, {}}
end
return {done, claim_jobs(KEYS[10], limit, tonumber(ARGV[6]), tonumber(ARGV[7]),
  tonumber(ARGV[8]), tonumber(ARGV[9]))}
