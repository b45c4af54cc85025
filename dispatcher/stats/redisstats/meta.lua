-- Reads what tells a reset store (see redisstats reseed): the generation,
-- the write sequence and the master's replication id.
-- KEYS[1] generation; KEYS[2] write sequence.
return {redis.call('GET', KEYS[1]) or '', redis.call('GET', KEYS[2]) or '0',
  string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)') or ''}
