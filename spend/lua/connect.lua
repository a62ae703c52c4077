-- connect: a call's media stream started on a node (spend/store.py, SpendStore.connect).
--
-- The one place a call turns admitted -> active, atomically: exactly one node wins a
-- call, and a call settled as never connected (settle.lua with unconnected_only) cannot
-- be started afterwards. Either this runs first and the call is active (the webhook
-- node's media watcher then leaves it alone), or the settlement ran first and this
-- answers "ended" (the media socket is refused). No money moves here.
--
-- The node that took the media becomes the call's owner ('node'): control messages
-- (gateway/control_channel.py) go there, not to the node that answered the webhook.
--
-- The call joins its node's call set (P:node:<id>:calls), where orphans.lua finds
-- the calls of a node that died.
--
-- KEYS: 1 call hash
-- ARGV: 1 node id, 2 answered_ms, 3 prefix, 4 call_id
-- Returns {won 1/0, status, node}: won with status "active" and this node; otherwise
-- the call's stored status and owner ("unknown_call" when there is no record).

local c = redis.call('HMGET', KEYS[1], 'status', 'node')
if not c[1] then
  return {0, 'unknown_call', ''}
end
if c[1] ~= 'admitted' then
  return {0, c[1], c[2] or ''}
end
redis.call('HSET', KEYS[1], 'status', 'active', 'node', ARGV[1], 'answered_ms', ARGV[2])
redis.call('SADD', ARGV[3] .. ':node:' .. ARGV[1] .. ':calls', ARGV[4])
return {1, 'active', ARGV[1]}
