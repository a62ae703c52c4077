-- extend: reserve more money for a running call (spend/store.py, SpendStore.extend).
--
-- Idempotent by the call's op sequence: a seq at or below the last applied one changes
-- nothing (a retry of the last extension gets its first answer back, flagged replayed).
-- Checks, in order: kill switch -> the call's own cost cap -> day budget -> month budget
-- (the day and month of the call's admission). Granted: reserved grows on the call, day
-- and month, ledger "extend". Refused: ledger "refuse"; nothing reserved. Either way the
-- lease is renewed and the running cost recorded: the call goes on on what it has.
--
-- The tenant's keys are derived from the prefix and the call's stored tenant/day/month
-- (the caller does not know them). Fine on a standalone Redis; Redis Cluster would need
-- hash tags putting a tenant's keys in one slot.
--
-- KEYS: 1 call hash, 2 global hash, 3 global active zset, 4 ledger stream
-- ARGV: 1 prefix, 2 call_id, 3 seq, 4 amount, 5 now_ms, 6 lease_ms, 7 cost,
--       8 ledger_max, 9 day_ttl_s, 10 month_ttl_s
-- Returns {granted 1/0, reason, reserved_total, replayed 1/0}.

local prefix, call_id = ARGV[1], ARGV[2]
local seq = tonumber(ARGV[3])
local amount = tonumber(ARGV[4])
local now_s = ARGV[5]
local now = tonumber(now_s)

-- int() and num() come from common.lua.

local c = redis.call('HMGET', KEYS[1], 'tenant', 'day', 'month', 'status', 'seq', 'reserved',
  'max_cost', 'ext_seq', 'ext_reason')
if not c[1] then
  return {0, 'unknown_call', 0, 0}
end
local tenant, day, month = c[1], c[2], c[3]
local reserved = num(c[6])
if c[4] ~= 'admitted' and c[4] ~= 'active' then
  return {0, 'not_active', reserved, 0}
end
if seq <= num(c[5]) then
  if c[8] and tonumber(c[8]) == seq then
    return {c[9] == 'ok' and 1 or 0, c[9], reserved, 1}
  end
  return {0, 'stale', reserved, 1}
end

-- Renew the lease (never shorten it: a late replay carries an older now).
local tenant_key = prefix .. ':tenant:' .. tenant
local lease = now + tonumber(ARGV[6])
for _, zkey in ipairs({KEYS[3], tenant_key .. ':active'}) do
  local current = tonumber(redis.call('ZSCORE', zkey, call_id))
  if current == nil or current < lease then
    redis.call('ZADD', zkey, int(lease), call_id)
  end
end
redis.call('HSET', KEYS[1], 'seq', int(seq), 'cost', ARGV[7])

local reason = nil
local killed = redis.call('HGET', KEYS[2], 'killed')
local max_cost = num(c[7])
local day_key = tenant_key .. ':d:' .. day
local month_key = tenant_key .. ':m:' .. month
if killed and killed ~= '' and killed ~= '0' then
  reason = 'kill_switch'
elseif max_cost > 0 and reserved + amount > max_cost then
  reason = 'max_call_cost'
else
  local limits = redis.call('HMGET', tenant_key .. ':limits', 'budget_day', 'budget_month')
  local budget_day, budget_month = num(limits[1]), num(limits[2])
  if budget_day > 0 then
    local d = redis.call('HMGET', day_key, 'spent', 'reserved')
    if num(d[1]) + num(d[2]) + amount > budget_day then
      reason = 'budget_day'
    end
  end
  if reason == nil and budget_month > 0 then
    local m = redis.call('HMGET', month_key, 'spent', 'reserved')
    if num(m[1]) + num(m[2]) + amount > budget_month then
      reason = 'budget_month'
    end
  end
end

if reason then
  redis.call('HSET', KEYS[1], 'ext_seq', int(seq), 'ext_reason', reason)
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[8], '*',
    'type', 'refuse', 'call', call_id, 'tenant', tenant, 'amount', int(amount),
    'reserved_total', int(reserved), 'reason', reason, 'at', now_s)
  return {0, reason, reserved, 0}
end

local total = redis.call('HINCRBY', KEYS[1], 'reserved', int(amount))
redis.call('HSET', KEYS[1], 'ext_seq', int(seq), 'ext_reason', 'ok')
redis.call('HINCRBY', day_key, 'reserved', int(amount))
redis.call('EXPIRE', day_key, ARGV[9])
redis.call('HINCRBY', month_key, 'reserved', int(amount))
redis.call('EXPIRE', month_key, ARGV[10])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[8], '*',
  'type', 'extend', 'call', call_id, 'tenant', tenant, 'amount', int(amount),
  'reserved_total', int(total), 'reason', '', 'at', now_s)
return {1, 'ok', total, 0}
