-- Applies one batch of statistics atomically (see redisstats.Record).
-- KEYS[1]   gauges hash; KEYS[2..] bucket hashes
-- ARGV      per bucket key: ttl_ms, nfields, nfields x (field, delta)
--           then ngauges, ngauges x (series "<model> <node> ", if_add,
--           cf_reset, cf_add, last_outcome or ""); in-flight is a signed
--           sum, read clamped at 0
local g = KEYS[1]
local a = 1
for k = 2, #KEYS do
  local key = KEYS[k]
  local ttl = ARGV[a]
  local nf = tonumber(ARGV[a + 1])
  a = a + 2
  for _ = 1, nf do
    redis.call('HINCRBY', key, ARGV[a], ARGV[a + 1])
    a = a + 2
  end
  redis.call('PEXPIRE', key, ttl)
end
local ng = tonumber(ARGV[a])
a = a + 1
for _ = 1, ng do
  local base = ARGV[a]
  local ifAdd = tonumber(ARGV[a + 1])
  local reset = ARGV[a + 2]
  local cfAdd = tonumber(ARGV[a + 3])
  local lo = ARGV[a + 4]
  a = a + 5

  local f = base .. 'if'
  local v = tonumber(redis.call('HGET', g, f) or '0') + ifAdd
  if v == 0 then redis.call('HDEL', g, f) else redis.call('HSET', g, f, v) end

  f = base .. 'cf'
  if reset == '1' then
    if cfAdd == 0 then redis.call('HDEL', g, f) else redis.call('HSET', g, f, cfAdd) end
  elseif cfAdd ~= 0 then
    redis.call('HINCRBY', g, f, cfAdd)
  end

  if lo ~= '' then
    f = base .. 'lo'
    local cur = redis.call('HGET', g, f)
    -- zero-padded decimal strings compare like the numbers, without the
    -- precision Lua numbers lose on nanoseconds
    if not cur or string.rep('0', 20 - #cur) .. cur < lo then redis.call('HSET', g, f, lo) end
  end
end
return 0
