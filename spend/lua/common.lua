-- common.lua: helpers shared by the spend scripts. spend/store.py puts this text in
-- front of each script when it registers it (Redis 6.2 has no shared Lua libraries).

-- Lua 5.1 prints numbers with %.14g: large integers would lose digits, so every
-- computed number written back to Redis goes through %d.
local function int(n)
  return string.format('%d', n)
end

local function num(raw)
  return tonumber(raw) or 0
end

-- Book a call's final money: `spent` into its day, month and hour buckets, and release
-- what it still held (`reserved`) from the day and month, refreshing each bucket's TTL.
local function book(tenant_key, day, month, hour, spent, reserved, day_ttl, month_ttl, hour_ttl)
  local day_key = tenant_key .. ':d:' .. day
  local month_key = tenant_key .. ':m:' .. month
  local hour_key = tenant_key .. ':h:' .. hour
  redis.call('HINCRBY', day_key, 'spent', int(spent))
  redis.call('HINCRBY', day_key, 'reserved', int(-reserved))
  redis.call('EXPIRE', day_key, day_ttl)
  redis.call('HINCRBY', month_key, 'spent', int(spent))
  redis.call('HINCRBY', month_key, 'reserved', int(-reserved))
  redis.call('EXPIRE', month_key, month_ttl)
  redis.call('INCRBY', hour_key, int(spent))
  redis.call('EXPIRE', hour_key, hour_ttl)
end


-- Close a running call its gateway can no longer settle, at `amount`, releasing its
-- whole reservation: the reaper (lease expired) and the orphan sweep (node lost) do
-- this alike. The money is booked, the call leaves the active sets, its record is ended
-- and marked reaped (so the owner's own late settlement corrects it once, settle.lua),
-- its hash and receipts get their retention expiry, and the ledger ("reap") and the
-- ended stream say so. `o` carries: prefix, call_id, call_key, tenant, day, month, hour,
-- amount, reserved, reason, now_s, active_key, ledger_key, ended_key, retention_s,
-- ledger_max, stream_max, day_ttl, month_ttl, hour_ttl.
local function reap_call(o)
  local tenant_key = o.prefix .. ':tenant:' .. o.tenant
  book(tenant_key, o.day, o.month, o.hour, o.amount, o.reserved, o.day_ttl, o.month_ttl,
    o.hour_ttl)
  redis.call('ZREM', o.active_key, o.call_id)
  redis.call('ZREM', tenant_key .. ':active', o.call_id)
  redis.call('HSET', o.call_key, 'status', 'ended', 'spent', int(o.amount), 'ended_ms', o.now_s,
    'end_reason', o.reason, 'reaped', '1', 'owner_settled', '0', 'hour', o.hour)
  redis.call('EXPIRE', o.call_key, o.retention_s)
  redis.call('EXPIRE', o.prefix .. ':receipts:' .. o.call_id, o.retention_s)
  redis.call('XADD', o.ledger_key, 'MAXLEN', '~', o.ledger_max, '*',
    'type', 'reap', 'call', o.call_id, 'tenant', o.tenant, 'amount', int(o.amount),
    'reserved_total', int(o.reserved), 'reason', o.reason, 'at', o.now_s)
  redis.call('XADD', o.ended_key, 'MAXLEN', '~', o.stream_max, '*',
    'at', o.now_s, 'call', o.call_id, 'tenant', o.tenant, 'reason', o.reason,
    'spent', int(o.amount))
end
