-- admit: one atomic admission decision for a new call (spend/store.py, SpendStore.admit).
--
-- Checks, in order: duplicate call id -> kill switch -> global concurrency -> tenant
-- concurrency -> caller calls/hour -> campaign calls/minute -> day budget -> month budget.
-- On success the first quantum is reserved on the tenant's day and month, the call joins
-- the active sets with a lease, and the ledger gets a "reserve" entry; on refusal the
-- ledger gets a "refuse" entry, the dashboard's refusal stream one too, and a refused
-- call's record gets a content-free receipt (ids, reason, time) like any other call's.
--
-- Time comes from the caller (ARGV now_ms, day, month): the script never calls TIME, so
-- a replay of the same request gives the same decision.
-- Every key is in KEYS. Redis Cluster would need the tenant's keys and the global keys
-- in one hash slot ({hash tags}); this store targets a standalone Redis (or a primary
-- with replicas).
--
-- KEYS: 1 global hash, 2 global active zset, 3 tenant limits hash, 4 tenant active zset,
--       5 day hash, 6 month hash, 7 caller window zset, 8 campaign window zset,
--       9 call hash, 10 tenant calls zset, 11 ledger stream, 12 refusals stream,
--       13 tenants set, 14 call receipts stream
-- ARGV: 1 call_id, 2 tenant, 3 now_ms, 4 day, 5 month, 6 quantum, 7 lease_ms,
--       8 caller, 9 campaign, 10 check_caller (1/0), 11 force (1/0), 12 retention_ms,
--       13 ledger_max, 14 stream_max, 15 day_ttl_s, 16 month_ttl_s,
--       17 caller_window_ms, 18 campaign_window_ms, 19 receipts_max,
--       20.. call fields (name, value pairs)
-- Returns {admitted 1/0, reason, global active count, tenant active count, replayed 1/0};
-- the counts are the non-expired leases observed inside this atomic step (after adding
-- this call when admitted).

local call_id, tenant = ARGV[1], ARGV[2]
local now_s = ARGV[3]
local now = tonumber(now_s)
local quantum = tonumber(ARGV[6])
local caller, campaign = ARGV[8], ARGV[9]
local force = ARGV[11] == '1'
local retention_ms = tonumber(ARGV[12])
local ledger_max, stream_max = ARGV[13], ARGV[14]

-- int() and num() come from common.lua.

-- A lease equal to now has expired ("(" = exclusive bound).
local global_count = redis.call('ZCOUNT', KEYS[2], '(' .. now_s, '+inf')
local tenant_count = redis.call('ZCOUNT', KEYS[4], '(' .. now_s, '+inf')

local function call_fields()
  local out = {}
  for i = 20, #ARGV do
    out[#out + 1] = ARGV[i]
  end
  return out
end

local function refuse(reason, write_call)
  redis.call('XADD', KEYS[11], 'MAXLEN', '~', ledger_max, '*',
    'type', 'refuse', 'call', call_id, 'tenant', tenant, 'amount', int(quantum),
    'reserved_total', '0', 'reason', reason, 'at', now_s)
  redis.call('XADD', KEYS[12], 'MAXLEN', '~', stream_max, '*',
    'at', now_s, 'tenant', tenant, 'reason', reason, 'caller', caller, 'call', call_id)
  if write_call then
    redis.call('HSET', KEYS[9], 'tenant', tenant, 'day', ARGV[4], 'month', ARGV[5],
      'status', 'refused', 'end_reason', reason, 'created_ms', now_s, 'ended_ms', now_s,
      'reserved', '0', 'cost', '0', 'seq', '0', 'caller', caller, 'campaign', campaign,
      unpack(call_fields()))
    redis.call('PEXPIRE', KEYS[9], int(retention_ms))
    redis.call('XADD', KEYS[14], 'MAXLEN', '~', ARGV[19], '*',
      'stage', 'spend', 'type', 'refused', 'reason', reason, 'at_unix_ms', now_s,
      'quantum', int(quantum))
    redis.call('PEXPIRE', KEYS[14], int(retention_ms))
    redis.call('ZADD', KEYS[10], now_s, call_id)
    redis.call('ZREMRANGEBYSCORE', KEYS[10], '-inf', '(' .. int(now - retention_ms))
    redis.call('SADD', KEYS[13], tenant)
  end
  return {0, reason, global_count, tenant_count, 0}
end

-- Idempotency: the same request again (same tenant and admission time) gets the first
-- answer back, so a client retry after a lost reply is safe; any other reuse of the id
-- is refused without touching the existing call.
local existing = redis.call('HMGET', KEYS[9], 'tenant', 'created_ms', 'status', 'end_reason')
if existing[1] then
  if existing[1] == tenant and existing[2] == now_s then
    if existing[3] == 'refused' then
      return {0, existing[4] or 'refused', global_count, tenant_count, 1}
    end
    return {1, 'ok', global_count, tenant_count, 1}
  end
  return refuse('duplicate_call', false)
end

local limits = redis.call('HMGET', KEYS[3], 'max_concurrent', 'caller_calls_per_hour',
  'campaign_calls_per_minute', 'budget_day', 'budget_month')

-- Window entries newer than now - window count (read-only here: the first write of a
-- script decides whether Redis refuses it for lack of memory, and only a refusal before
-- any write keeps a script all-or-nothing; old entries are pruned after the decision).
local caller_since = '(' .. int(now - tonumber(ARGV[17]))
local campaign_since = '(' .. int(now - tonumber(ARGV[18]))

if not force then
  local global = redis.call('HMGET', KEYS[1], 'killed', 'max_concurrent')
  -- Anything but "0"/absent is engaged: a corrupted switch fails safe.
  if global[1] and global[1] ~= '' and global[1] ~= '0' then
    return refuse('kill_switch', true)
  end
  local global_max = num(global[2])
  if global_max > 0 and global_count >= global_max then
    return refuse('global_concurrency', true)
  end
  local tenant_max = num(limits[1])
  if tenant_max > 0 and tenant_count >= tenant_max then
    return refuse('tenant_concurrency', true)
  end
  local per_hour = num(limits[2])
  if ARGV[10] == '1' and caller ~= '' and per_hour > 0
      and redis.call('ZCOUNT', KEYS[7], caller_since, '+inf') >= per_hour then
    return refuse('caller_rate', true)
  end
  local per_minute = num(limits[3])
  if campaign ~= '' and per_minute > 0
      and redis.call('ZCOUNT', KEYS[8], campaign_since, '+inf') >= per_minute then
    return refuse('campaign_rate', true)
  end
  local budget_day = num(limits[4])
  if budget_day > 0 then
    local d = redis.call('HMGET', KEYS[5], 'spent', 'reserved')
    if num(d[1]) + num(d[2]) + quantum > budget_day then
      return refuse('budget_day', true)
    end
  end
  local budget_month = num(limits[5])
  if budget_month > 0 then
    local m = redis.call('HMGET', KEYS[6], 'spent', 'reserved')
    if num(m[1]) + num(m[2]) + quantum > budget_month then
      return refuse('budget_month', true)
    end
  end
end

local lease = int(now + tonumber(ARGV[7]))
redis.call('ZADD', KEYS[2], lease, call_id)
redis.call('ZADD', KEYS[4], lease, call_id)
redis.call('HINCRBY', KEYS[5], 'reserved', int(quantum))
redis.call('EXPIRE', KEYS[5], ARGV[15])
redis.call('HINCRBY', KEYS[6], 'reserved', int(quantum))
redis.call('EXPIRE', KEYS[6], ARGV[16])
redis.call('HSET', KEYS[9], 'tenant', tenant, 'day', ARGV[4], 'month', ARGV[5],
  'status', 'admitted', 'created_ms', now_s, 'reserved', int(quantum), 'cost', '0',
  'seq', '0', 'caller', caller, 'campaign', campaign, unpack(call_fields()))
redis.call('ZADD', KEYS[10], now_s, call_id)
redis.call('ZREMRANGEBYSCORE', KEYS[10], '-inf', '(' .. int(now - retention_ms))
redis.call('SADD', KEYS[13], tenant)
if ARGV[10] == '1' and caller ~= '' then
  redis.call('ZADD', KEYS[7], now_s, call_id)
  redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', string.sub(caller_since, 2))
  redis.call('PEXPIRE', KEYS[7], ARGV[17])
end
if campaign ~= '' then
  redis.call('ZADD', KEYS[8], now_s, call_id)
  redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', string.sub(campaign_since, 2))
  redis.call('PEXPIRE', KEYS[8], ARGV[18])
end
redis.call('XADD', KEYS[11], 'MAXLEN', '~', ledger_max, '*',
  'type', 'reserve', 'call', call_id, 'tenant', tenant, 'amount', int(quantum),
  'reserved_total', int(quantum), 'reason', force and 'forced' or '', 'at', now_s)
return {1, 'ok', global_count + 1, tenant_count + 1, 0}
