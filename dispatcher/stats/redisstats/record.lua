-- Applies one batch of statistics atomically (see redisstats.Record).
-- KEYS[1]   gauges hash; KEYS[2] generation; KEYS[3] write sequence;
-- KEYS[4..] bucket hashes
-- ARGV      known generation ('' if none yet), known sequence, a new
--           generation to create if there is none and none is known, the
--           known replication id of the master ('' if none yet), now
--           (ms since the epoch, stamped on every series written: "tw");
--           then per bucket key: ttl_ms, nfields, nfields x (field, delta)
--           then ngauges, ngauges x (series "<model> <node> ", if_add,
--           cf_reset, cf_add, last_outcome or ""); in-flight is a signed
--           sum, read clamped at 0
-- Returns {0, generation, sequence, replid} when applied; {1, ...}
-- without applying anything when the store may not be the one the caller
-- knows, so that the caller re-seeds it first: the generation is missing or
-- changed (restarted empty), the sequence is behind one the caller saw, or
-- the master's replication id changed (a replica was promoted: it may have
-- missed the latest writes).
local rid = string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)') or ''
local gen = redis.call('GET', KEYS[2])
local known = ARGV[1]
if not gen then
  if known ~= '' then return {1, '', 0, rid} end
  gen = ARGV[3]
  redis.call('SET', KEYS[2], gen)
elseif known ~= '' and gen ~= known then
  return {1, gen, 0, rid}
end
if ARGV[4] ~= '' and rid ~= ARGV[4] then return {1, gen, 0, rid} end
local seq = tonumber(redis.call('GET', KEYS[3]) or '0')
if seq < tonumber(ARGV[2]) then return {1, gen, seq, rid} end

local g = KEYS[1]
local a = 6
for k = 4, #KEYS do
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

  redis.call('HSET', g, base .. 'tw', ARGV[5])
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
return {0, gen, redis.call('INCR', KEYS[3]), rid}
