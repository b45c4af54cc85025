-- Finishes a re-seed (see redisstats reseed): merges the gauges and the
-- breakers the caller remembers, then moves the store to a new generation
-- unless another replica already did, so that every replica notices the
-- reset and merges what it remembers once.
-- KEYS[1] gauges hash; KEYS[2] breakers hash; KEYS[3] generation;
-- KEYS[4] write sequence; KEYS[5] the last generation re-seeded
-- ARGV    old generation (the one the caller knew), new generation, known
--         sequence, ngauges, ngauges x (field, value), ndel, ndel x field
--         (gauges of series the caller knows that are zero for it), then
--         (field, value) pairs of breakers.
-- Gauges: the first replica to re-seed (the store still has the old
-- generation, or none, or one that nobody re-seeded: a replica that
-- remembered nothing wrote first) replaces them with the ones it remembers, which are
-- newer than whatever a reset left; later ones only move each last outcome
-- to the later time, because the store has moved on since the first.
-- Breakers: the state with the later transition wins. Times are compared as
-- zero-padded decimal strings (Lua numbers lose nanoseconds).
-- Returns {generation, fields written, the master's replication id}.
local function pad(s) return string.rep('0', 20 - #s) .. s end
local gen = redis.call('GET', KEYS[3])
local first = (not gen) or gen == ARGV[1] or redis.call('GET', KEYS[5]) ~= gen
local n = 0
local ng = tonumber(ARGV[4])
local a = 5
local nd = tonumber(ARGV[a + 2 * ng])
if first then
  -- series the caller does not know (written since by a replica that
  -- remembered nothing) keep their gauges
  for i = a + 2 * ng + 1, a + 2 * ng + nd do redis.call('HDEL', KEYS[1], ARGV[i]) end
end
for _ = 1, ng do
  local f, v = ARGV[a], ARGV[a + 1]
  a = a + 2
  if string.sub(f, -2) == 'lo' then
    local cur = redis.call('HGET', KEYS[1], f)
    if not cur or pad(cur) < pad(v) then redis.call('HSET', KEYS[1], f, v); n = n + 1 end
  elseif first then
    redis.call('HSET', KEYS[1], f, v); n = n + 1
  end
end
for i = a + 1 + nd, #ARGV, 2 do
  local f, v = ARGV[i], ARGV[i + 1]
  local cur = redis.call('HGET', KEYS[2], f) or '0:0'
  local cs = string.match(cur, ':(%d+)$') or '0'
  local vs = string.match(v, ':(%d+)$') or '0'
  if pad(cs) < pad(vs) then redis.call('HSET', KEYS[2], f, v); n = n + 1 end
end
if first then
  gen = ARGV[2]
  redis.call('SET', KEYS[3], gen)
  redis.call('SET', KEYS[5], gen)
end
local seq = tonumber(redis.call('GET', KEYS[4]) or '0')
if seq < tonumber(ARGV[3]) then redis.call('SET', KEYS[4], ARGV[3]) end
return {gen, n, string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)') or ''}
