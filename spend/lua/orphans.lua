-- orphans: settle the live calls of gateway nodes that stopped beating (crashed,
-- killed, cut off) (spend/store.py, SpendStore.settle_orphans).
--
-- Every node beats into the nodes zset (node -> last beat, ms; SpendStore.node_beat)
-- and each call that turns active joins its node's call set (connect.lua). A node
-- whose last beat is older than dead_before is dead: each of its calls still active
-- and still its own is settled from the last figures its meter wrote (the running
-- cost of its last heartbeat, never above its reservation), end_reason "node_lost",
-- ledger "reap", a "settled" receipt closing its receipts. If the node comes back and
-- delivers the real settlement, settle.lua corrects it once ("adjust"), as for a
-- lease the reaper expired. Calls still "admitted" are left to their lease (their
-- media may yet reach another node). A node with no call left leaves the zset.
-- ARGV 12 names a node to treat as dead whatever its beat: a node restarting under
-- the same id holds none of the calls its previous life left active.
--
-- KEYS: 1 nodes zset, 2 global active zset, 3 ledger stream, 4 ended stream
-- ARGV: 1 prefix, 2 now_ms, 3 dead_before_ms, 4 limit, 5 hour, 6 retention_s,
--       7 ledger_max, 8 stream_max, 9 day_ttl_s, 10 month_ttl_s, 11 hour_ttl_s,
--       12 node to treat as dead ('' for none)
-- Returns {calls settled, nodes forgotten}.

local prefix, now_s, hour = ARGV[1], ARGV[2], ARGV[5]
local limit = tonumber(ARGV[4])

local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[3], 'LIMIT', 0, 10)
if ARGV[12] ~= '' then
  table.insert(dead, ARGV[12])
end

local settled, forgotten = 0, 0
for _, node in ipairs(dead) do
  local set_key = prefix .. ':node:' .. node .. ':calls'
  local members = redis.call('SRANDMEMBER', set_key, limit - settled)
  for _, call_id in ipairs(members) do
    redis.call('SREM', set_key, call_id)
    local call_key = prefix .. ':call:' .. call_id
    local c = redis.call('HMGET', call_key, 'tenant', 'day', 'month', 'status', 'reserved',
      'cost', 'node')
    if c[1] and c[4] == 'active' and c[7] == node then
      local reserved = num(c[5])
      local amount = math.min(reserved, num(c[6]))
      -- The receipt first: reap_call() (common.lua) gives the stream its retention.
      redis.call('XADD', prefix .. ':receipts:' .. call_id, '*', 'at_ms', now_s,
        'stage', 'spend', 'type', 'settled', 'actual', int(amount), 'reason', 'node_lost',
        'node', node)
      reap_call({prefix = prefix, call_id = call_id, call_key = call_key, tenant = c[1],
        day = c[2], month = c[3], hour = hour, amount = amount, reserved = reserved,
        reason = 'node_lost', now_s = now_s, active_key = KEYS[2], ledger_key = KEYS[3],
        ended_key = KEYS[4], retention_s = ARGV[6], ledger_max = ARGV[7],
        stream_max = ARGV[8], day_ttl = ARGV[9], month_ttl = ARGV[10], hour_ttl = ARGV[11]})
      settled = settled + 1
    end
  end
  if redis.call('SCARD', set_key) == 0 then
    if redis.call('ZREM', KEYS[1], node) == 1 then
      forgotten = forgotten + 1
    end
  end
  if settled >= limit then
    break
  end
end
return {settled, forgotten}
