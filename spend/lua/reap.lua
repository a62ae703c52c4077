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
    if c[4] == 'active' and c[7] then
      redis.call('SREM', prefix .. ':node:' .. c[7] .. ':calls', call_id)
    end
    local reserved = num(c[5])
    -- reap_call() comes from common.lua.
    reap_call({prefix = prefix, call_id = call_id, call_key = call_key, tenant = c[1],
      day = c[2], month = c[3], hour = hour, amount = math.max(reserved, num(c[6])),
      reserved = reserved, reason = 'lease_expired', now_s = now_s, active_key = KEYS[1],
      ledger_key = KEYS[2], ended_key = KEYS[3], retention_s = ARGV[5], ledger_max = ARGV[6],
      stream_max = ARGV[7], day_ttl = ARGV[8], month_ttl = ARGV[9], hour_ttl = ARGV[10]})
    reaped = reaped + 1
  end
end
return reaped
