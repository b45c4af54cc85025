-- Forgets the series (a model, or a model on a node) not written for a
-- while (see redisstats.Sweep): their gauges and their breaker.
-- KEYS[1] gauges hash; KEYS[2] breakers hash
-- ARGV[1] now (ms since the epoch); ARGV[2] how long a series may stay
-- unwritten (ms).
-- Every Record stamps the series it touches with "<model> <node> tw" (ms).
-- A series without a stamp (written by an older version, or a breaker
-- alone) is stamped now, so that it too goes once idle that long.
-- Returns the number of series forgotten.
local now, idle = tonumber(ARGV[1]), tonumber(ARGV[2])
local stamp = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local base, name = string.match(all[i], '^(.* )([^ ]*)$')
  if base then
    if name == 'tw' then
      stamp[base] = tonumber(all[i + 1]) or 0
    elseif stamp[base] == nil then
      stamp[base] = false
    end
  end
end
local br = redis.call('HKEYS', KEYS[2])
for _, f in ipairs(br) do
  if stamp[f .. ' '] == nil then stamp[f .. ' '] = false end
end
local n = 0
for base, at in pairs(stamp) do
  if at == false then
    redis.call('HSET', KEYS[1], base .. 'tw', ARGV[1])
  elseif now - at >= idle then
    redis.call('HDEL', KEYS[1], base .. 'if', base .. 'cf', base .. 'lo', base .. 'tw')
    redis.call('HDEL', KEYS[2], string.sub(base, 1, -2))
    n = n + 1
  end
end
return n
