-- annotate: set descriptive fields (provider call id, answer time) on a call that is
-- still running (spend/store.py, SpendStore.update_call). Never touches money fields or
-- the status (the caller only passes the allowed names; connect.lua moves the status),
-- never brings an ended, refused or expired call back.
--
-- KEYS: 1 call hash
-- ARGV: field, value pairs
-- Returns 1 if written, 0 if the call is unknown or no longer running.

local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'admitted' and status ~= 'active' then
  return 0
end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
