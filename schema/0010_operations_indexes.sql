-- What the store exporter (`shardq metrics`) and `shardq stale` read, each
-- family one indexed query per shard:
-- waits_age: waits open longer than a bound of their kind, oldest first;
-- waits_deadline: waits whose deadline passed and that were not woken (the
-- timer task that should have claimed them is overdue).
CREATE INDEX waits_age ON shardq.waits (kind, started_at);
CREATE INDEX waits_deadline ON shardq.waits (deadline) WHERE deadline IS NOT NULL;
