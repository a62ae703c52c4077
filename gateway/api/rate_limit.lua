-- Per-API-key request rate limit: GCRA (generic cell rate algorithm), one atomic step.
--
-- State is one number per key, the theoretical arrival time (TAT, unix microseconds):
-- the moment the key's allowance would be fully used if requests kept coming at the
-- emission interval. A request is allowed when TAT + interval - now <= burst * interval,
-- i.e. at most `burst` requests at once, then one per interval.
--
-- KEYS[1]  the key's TAT
-- ARGV[1]  now, unix milliseconds (the caller's clock: no TIME call, so a run replays
--          deterministically and tests can drive virtual time)
-- ARGV[2]  emission interval, microseconds (1e6 / rate per second)
-- ARGV[3]  burst: requests allowed back to back from a rested key
-- Returns {allowed (1|0), retry_after_us, remaining}
--
-- Times in microseconds stay below 2^53 (exact in Lua's doubles) until the year 2255;
-- values are written with %.0f because tostring() would round them to 14 digits.

local now = tonumber(ARGV[1]) * 1000
local interval = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])

local tat = now
local stored = redis.call('GET', KEYS[1])
if stored then
  local value = tonumber(stored)
  if value and value > now then
    tat = value
  end
end

local new_tat = tat + interval
local allow_at = new_tat - interval * burst
if now < allow_at then
  return {0, allow_at - now, 0}
end

-- The key matters only until its TAT has passed; then a missing key means "rested".
local ttl_ms = math.ceil((new_tat - now) / 1000)
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', ttl_ms)
return {1, 0, math.floor((now - allow_at) / interval)}
