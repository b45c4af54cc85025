-- Compare-and-set of one breaker (see redisstats.SetBreaker).
-- KEYS[1] breakers hash; ARGV field, from "state:since", to "state:since".
-- A missing breaker is "0:0": closed since the zero time.
local cur = redis.call('HGET', KEYS[1], ARGV[1]) or '0:0'
if cur ~= ARGV[2] then return 0 end
if ARGV[3] == '0:0' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
end
return 1
