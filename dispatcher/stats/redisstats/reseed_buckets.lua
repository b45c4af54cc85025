-- Re-seeds one bucket hash after a reset (see redisstats reseed): each
-- field becomes the larger of its stored value and the caller's, so that
-- replicas re-seeding at once, or twice, never add up what they remember.
-- KEYS[1] bucket hash; ARGV ttl_ms, then (field, value) pairs.
local n = 0
for i = 2, #ARGV, 2 do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  if not cur or tonumber(cur) < tonumber(ARGV[i + 1]) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    n = n + 1
  end
end
if n > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return n
