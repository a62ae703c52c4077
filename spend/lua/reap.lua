-- reap: settle calls whose lease expired because their gateway stopped renewing it
-- (crashed, partitioned) (spend/store.py, SpendStore.reap).
--
-- Each such call is settled conservatively at the larger of its full reservation and
-- its last reported running cost, end_reason "lease_expired", ledger "reap". If the
-- owner later delivers the real settlement (from its journal), settle.lua corrects it
-- once ("adjust"). Up to `limit` calls per run keeps each run short (Redis runs one
-- script at a time).
--
-- Call and tenant keys are derived from the prefix (standalone Redis; Cluster would
-- need hash tags).
--
-- KEYS: 1 global active zset, 2 ledger stream, 3 ended stream
-- ARGV: 1 prefix, 2 now_ms, 3 limit, 4 hour, 5 retention_s, 6 ledger_max, 7 stream_max,
--       8 day_ttl_s, 9 month_ttl_s, 10 hour_ttl_s
-- Returns the number of calls settled.

local prefix, now_s, hour = ARGV[1], ARGV[2], ARGV[4]

-- int() and num() come from common.lua.

local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_s, 'LIMIT', 0, ARGV[3])
local reaped = 0
for _, call_id in ipairs(expired) do
  redis.call('ZREM', KEYS[1], call_id)
  local call_key = prefix .. ':call:' .. call_id
  local c = redis.call('HMGET', call_key, 'tenant', 'day', 'month', 'status', 'reserved', 'cost',
    'node')
  if c[1] and (c[4] == 'admitted' or c[4] == 'active') then
    local tenant = c[1]
    local reserved = num(c[5])
    local amount = math.max(reserved, num(c[6]))
    local tenant_key = prefix .. ':tenant:' .. tenant
    book(tenant_key, c[2], c[3], hour, amount, reserved, ARGV[8], ARGV[9], ARGV[10])
    redis.call('ZREM', tenant_key .. ':active', call_id)
    if c[4] == 'active' and c[7] then
      redis.call('SREM', prefix .. ':node:' .. c[7] .. ':calls', call_id)
    end
    redis.call('HSET', call_key, 'status', 'ended', 'spent', int(amount), 'ended_ms', now_s,
      'end_reason', 'lease_expired', 'reaped', '1', 'owner_settled', '0', 'hour', hour)
    redis.call('EXPIRE', call_key, ARGV[5])
    redis.call('EXPIRE', prefix .. ':receipts:' .. call_id, ARGV[5])
    redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[6], '*',
      'type', 'reap', 'call', call_id, 'tenant', tenant, 'amount', int(amount),
      'reserved_total', int(reserved), 'reason', 'lease_expired', 'at', now_s)
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[7], '*',
      'at', now_s, 'call', call_id, 'tenant', tenant, 'reason', 'lease_expired',
      'spent', int(amount))
    reaped = reaped + 1
  end
end
return reaped
