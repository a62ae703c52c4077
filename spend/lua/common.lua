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

