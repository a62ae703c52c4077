-- heartbeat: renew a running call's lease and record its running cost; no money moves
-- (spend/store.py, SpendStore.heartbeat). Cheap enough to send every few seconds.
--
-- Idempotent by the call's op sequence (a stale seq changes nothing), and a call that
-- has ended is never brought back. Also reports the kill switch, so a gateway learns
-- within one heartbeat that it must stop spending.
-- The tenant's active set is derived from the prefix (standalone Redis; Cluster would
-- need hash tags).
--
-- KEYS: 1 call hash, 2 global hash, 3 global active zset
-- ARGV: 1 prefix, 2 call_id, 3 seq, 4 now_ms, 5 lease_ms, 6 cost
-- Returns {applied 1/0, status, kill switch engaged 1/0}.

local prefix, call_id = ARGV[1], ARGV[2]
local seq = tonumber(ARGV[3])

local killed_raw = redis.call('HGET', KEYS[2], 'killed')
local killed = (killed_raw and killed_raw ~= '' and killed_raw ~= '0') and 1 or 0

local c = redis.call('HMGET', KEYS[1], 'tenant', 'status', 'seq')
if not c[1] then
  return {0, 'unknown_call', killed}
end
if c[2] ~= 'admitted' and c[2] ~= 'active' then
  return {0, 'not_active', killed}
end
if seq <= (tonumber(c[3]) or 0) then
  return {0, 'stale', killed}
end

local lease = tonumber(ARGV[4]) + tonumber(ARGV[5])
for _, zkey in ipairs({KEYS[3], prefix .. ':tenant:' .. c[1] .. ':active'}) do
  local current = tonumber(redis.call('ZSCORE', zkey, call_id))
  if current == nil or current < lease then
    redis.call('ZADD', zkey, string.format('%d', lease), call_id)
  end
end
redis.call('HSET', KEYS[1], 'seq', ARGV[3], 'cost', ARGV[6])
return {1, 'ok', killed}
