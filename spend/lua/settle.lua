-- settle: record a call's actual cost and release its reservation
-- (spend/store.py, SpendStore.settle).
--
-- day/month: spent += actual, reserved -= the call's total reserved; hour bucket +=
-- actual; the call leaves the active sets, its hash and receipts get their retention
-- expiry; ledger "settle" (amount = actual) and an entry on the "ended" stream.
-- Idempotent: a settled call is left alone ("replayed"). One exception: a call the
-- reaper settled (its gateway stopped renewing the lease) at the conservative full
-- reservation gets corrected once by the owner's late, real settlement: spent moves
-- by (actual - reaped amount), recorded as a ledger "adjust" entry with that signed
-- amount, so that sum(settle + reap + adjust amounts) == spent still holds.
--
-- The tenant's keys are derived from the prefix and the call's stored tenant/day/month
-- (standalone Redis; Cluster would need hash tags).
--
-- KEYS: 1 call hash, 2 global active zset, 3 ledger stream, 4 ended stream,
--       5 call receipts stream
-- ARGV: 1 prefix, 2 call_id, 3 seq, 4 actual, 5 now_ms, 6 end_reason, 7 hour,
--       8 retention_s, 9 ledger_max, 10 stream_max, 11 day_ttl_s, 12 month_ttl_s,
--       13 hour_ttl_s, 14 unconnected_only ('1': settle only a call still "admitted")
-- Returns {applied 1/0, status, reserved_total, spent}; status is settled | adjusted |
-- replayed | unknown_call | not_admitted | connected.
--
-- unconnected_only is how a call that never connected (no answer, no media in time,
-- cancelled) is settled at zero: checked here, atomically with connect.lua, so a call
-- whose media started on another node in the meantime is never zeroed ("connected").

local prefix, call_id = ARGV[1], ARGV[2]
local seq = tonumber(ARGV[3])
local actual = tonumber(ARGV[4])
local now_s, end_reason = ARGV[5], ARGV[6]

-- int() and num() come from common.lua.

local c = redis.call('HMGET', KEYS[1], 'tenant', 'day', 'month', 'status', 'reserved', 'seq',
  'spent', 'reaped', 'owner_settled', 'hour', 'node')
if not c[1] then
  return {0, 'unknown_call', 0, 0}
end
local tenant, day, month, status = c[1], c[2], c[3], c[4]
local reserved = num(c[5])
local new_seq = math.max(seq, num(c[6]))
local tenant_key = prefix .. ':tenant:' .. tenant

if status == 'refused' then
  return {0, 'not_admitted', 0, 0}
end

if status == 'ended' then
  if c[8] == '1' and c[9] ~= '1' then
    local delta = actual - num(c[7])
    -- The reaper already released the reservation: only the spend moves.
    book(tenant_key, day, month, c[10], delta, 0, ARGV[11], ARGV[12], ARGV[13])
    redis.call('HSET', KEYS[1], 'spent', int(actual), 'owner_settled', '1',
      'end_reason', end_reason, 'seq', int(new_seq))
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[9], '*',
      'type', 'adjust', 'call', call_id, 'tenant', tenant, 'amount', int(delta),
      'reserved_total', int(reserved), 'reason', end_reason, 'at', now_s)
    return {1, 'adjusted', reserved, actual}
  end
  return {0, 'replayed', reserved, num(c[7])}
end

if ARGV[14] == '1' and status ~= 'admitted' then
  return {0, 'connected', reserved, num(c[7])}
end

book(tenant_key, c[2], c[3], ARGV[7], actual, reserved, ARGV[11], ARGV[12], ARGV[13])
if status == 'active' and c[11] then
  redis.call('SREM', prefix .. ':node:' .. c[11] .. ':calls', call_id)
end
redis.call('ZREM', KEYS[2], call_id)
redis.call('ZREM', tenant_key .. ':active', call_id)
redis.call('HSET', KEYS[1], 'status', 'ended', 'spent', int(actual), 'ended_ms', now_s,
  'end_reason', end_reason, 'seq', int(new_seq), 'owner_settled', '1', 'hour', ARGV[7])
redis.call('EXPIRE', KEYS[1], ARGV[8])
redis.call('EXPIRE', KEYS[5], ARGV[8])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[9], '*',
  'type', 'settle', 'call', call_id, 'tenant', tenant, 'amount', int(actual),
  'reserved_total', int(reserved), 'reason', end_reason, 'at', now_s)
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[10], '*',
  'at', now_s, 'call', call_id, 'tenant', tenant, 'reason', end_reason, 'spent', int(actual))
return {1, 'settled', reserved, actual}
