-- The review inbox lists open interrupts across a shard oldest first, a keyset
-- page at a time (Client.pending_interrupts): this index serves that walk
-- without touching the waits of timers and signals.
CREATE INDEX waits_interrupts ON shardq.waits (started_at, execution_id)
    WHERE kind = 'interrupt';
