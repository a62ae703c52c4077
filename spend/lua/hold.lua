-- hold: keep an admitted call that has not connected yet (an outbound call ringing, an
-- inbound call whose media stream is on its way) out of the reaper's reach
-- (spend/store.py, SpendStore.hold). No money moves and the op sequence is untouched:
-- the live call's own heartbeats and extensions start at seq 1 once it connects.
--
-- Only a call still "admitted" is held: once it is active its own heartbeats keep it,
-- and an ended call is never brought back. The lease only ever moves later.
-- The tenant's active set is derived from the prefix (standalone Redis; Cluster would
-- need hash tags).
--
-- KEYS: 1 call hash, 2 global active zset
-- ARGV: 1 prefix, 2 call_id, 3 now_ms, 4 lease_ms
-- Returns {held 1/0, status} (status: the call's stored status, or "unknown_call").

local prefix, call_id = ARGV[1], ARGV[2]

local c = redis.call('HMGET', KEYS[1], 'tenant', 'status')
if not c[1] then
  return {0, 'unknown_call'}
end
if c[2] ~= 'admitted' then
  return {0, c[2] or ''}
end

local lease = tonumber(ARGV[3]) + tonumber(ARGV[4])
for _, zkey in ipairs({KEYS[2], prefix .. ':tenant:' .. c[1] .. ':active'}) do
  local current = tonumber(redis.call('ZSCORE', zkey, call_id))
  if current == nil or current < lease then
    redis.call('ZADD', zkey, string.format('%d', lease), call_id)
  end
end
return {1, 'admitted'}
