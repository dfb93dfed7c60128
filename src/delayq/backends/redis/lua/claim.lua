-- claim: hand up to `limit` due jobs to one worker under a lease.
-- KEYS[1..9]: due, running, dead, seq, token, wake, succeeded, cancelled, skipped (see _lib.lua)
-- KEYS[10]  this claim request's key, unique per call and kept for its retry: when it
--           exists, the call is a retry whose first reply was lost, and it returns the
--           jobs that call claimed (those still held by its tokens)
-- ARGV[1..4]: job key prefix, now ("" = TIME), retention, shadow prefix (see _lib.lua)
-- ARGV[5]   limit: the most jobs to claim
-- ARGV[6]   lease in seconds
-- ARGV[7]   the most expired leases to recover in this call
-- ARGV[8]   how long the request's record is kept for a retry, in ms
-- ARGV[9]   the most expired finished records to drop from their indexes in this call
-- Returns {now, lease_until, next, woke, id1, fields1, id2, fields2, ...}: fields is the
-- job's HGETALL after the claim; next is the milliseconds until the next due job or lease
-- expiry after this claim ("" when there is none), so a worker can wait without asking
-- again; woke is 1 when the new lease ends before anything sleeping workers wait for.

return claim_jobs(KEYS[10], tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]),
  tonumber(ARGV[8]), tonumber(ARGV[9]))
