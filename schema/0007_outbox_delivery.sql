-- Cross-shard signals: what the outbox relay needs of the outbox and of the
-- target's signals.
--
-- The outbox has held no rows before this release (nothing wrote it), so its
-- new NOT NULL column needs no default.
--
-- target_bucket: the target's bucket, so an operator's view and the metrics
-- group a source shard's backlog by target shard in SQL (the shard map turns
-- buckets into shards) without decoding ids.
--
-- queued_at: when the row last entered the queue: written, or re-queued by
-- an operator after a permanent failure. The relay's age limit counts from
-- it; created_at stays when the sender wrote it.
--
-- outbox_source: one row per sending call; its identity (source execution,
-- position) is also the origin the relay delivers under (see signals.origin).
--
-- outbox_pair: signals from one sender to one target arrive in send order, so
-- the relay claims a row only when no earlier row of its pair is pending;
-- this index answers that probe.
--
-- Delivered rows are deleted by the relay, not kept as 'delivered': the
-- sender's history records the send and the target's records the arrival, so
-- the row would only be bloat for retention to remove.
ALTER TABLE shardq.outbox ADD COLUMN target_bucket smallint NOT NULL,
                          ADD COLUMN queued_at timestamptz NOT NULL DEFAULT now();
CREATE UNIQUE INDEX outbox_source ON shardq.outbox (source_execution_id, source_position);
CREATE INDEX outbox_pair ON shardq.outbox (source_execution_id, target_execution_id, id)
    WHERE state = 'pending';
CREATE INDEX outbox_failed ON shardq.outbox (id) WHERE state = 'failed';

-- origin: the identity of the outbox row a relayed signal was delivered
-- under ("<source execution id>/<position>"). A relay that delivered and died
-- before marking its source row delivers again; the target finds the origin
-- and collapses the repeat, with or without a user key.
ALTER TABLE shardq.signals ADD COLUMN origin text;
CREATE UNIQUE INDEX signals_origin ON shardq.signals (execution_id, origin)
    WHERE origin IS NOT NULL;
