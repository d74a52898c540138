-- The outbox's statements: what the relay claims, delivers and settles, and
-- what an operator reads of the outbox (outbox/store.py). Loaded by name
-- (shards/sqlfile.py). The rows are written by a sender's turn commit
-- (schema/functions/commit_turns_v2.sql), the table is in schema/.

-- name: listen_outbox_statement
-- The LISTEN for the channel commits that write outbox rows notify.
SELECT shardq.outbox_channel() AS channel, format('LISTEN %%I', shardq.outbox_channel()) AS statement

-- name: claim_outbox
-- Lock up to `limit` due outbox rows for delivery, skipping rows another relay
-- holds; one sender's rows to one target in send order. Body and why it is a
-- function: schema/functions/claim_outbox.sql.
SELECT id, source_execution_id, source_position, target_execution_id, target_bucket,
       tenant, signal_name, payload, idempotency_key, attempts, queued_s, trace
FROM shardq.claim_outbox(%(limit)s)

-- name: outbox_next_due
-- Seconds until the next row a claim could take is due (negative: overdue; null:
-- none): the first of its sender and target still pending. The rows queued
-- behind one that backs off keep the time they were queued at, long past, and
-- would otherwise have the relay claim again and again, finding nothing, for as
-- long as the first one retries. One pass over the pending rows, as the claim;
-- no join, so no plan of it reads a row twice.
SELECT extract(epoch FROM min(f.next_attempt_at) - now())::float8 AS seconds
FROM (
    SELECT DISTINCT ON (e.source_execution_id, e.target_execution_id)
           e.source_execution_id, e.next_attempt_at
    FROM shardq.outbox e WHERE e.state = 'pending'
    ORDER BY e.source_execution_id, e.target_execution_id, e.id
) f
WHERE (SELECT shardq.unclean_writable()) IS NULL
   OR get_bit((SELECT shardq.unclean_writable()), shardq.bucket(f.source_execution_id)) = 1

-- name: outbox_target_back
-- A target shard takes writes again: the rows deferred while it was down are
-- due now, not when their backoff would have let them.
UPDATE shardq.outbox SET next_attempt_at = now()
WHERE state = 'pending' AND next_attempt_at > now()
  AND target_bucket BETWEEN %(first)s AND %(last)s

-- name: settle_outbox
-- What one relay round did with its claimed rows, in the claim's transaction:
-- delivered rows go (the sender's and the target's histories keep the record);
-- rows to retry get their attempt, last error and next attempt time; rows that
-- failed for good keep their reason, and their sender's history gets an
-- `external.failed` event naming the call's position.
WITH delivered AS (
    DELETE FROM shardq.outbox o WHERE o.id = ANY(%(delivered)s::bigint[])
), retried AS (
    UPDATE shardq.outbox o
    SET attempts = o.attempts + 1,
        -- From the settle, not the claim: a round that waited on a slow target
        -- must not have used up the backoff it sets.
        next_attempt_at = clock_timestamp() + make_interval(
            secs => (%(retry_delays)s::float8[])[array_position(%(retry_ids)s::bigint[], o.id)]),
        failure_reason = (%(retry_reasons)s::text[])[array_position(%(retry_ids)s::bigint[], o.id)],
        failure_detail = (%(retry_details)s::text[])[array_position(%(retry_ids)s::bigint[], o.id)]
    WHERE o.id = ANY(%(retry_ids)s::bigint[])
), failed AS (
    UPDATE shardq.outbox o
    SET state = 'failed', attempts = o.attempts + 1, finished_at = now(),
        failure_reason = (%(failed_reasons)s::text[])[array_position(%(failed_ids)s::bigint[], o.id)],
        failure_detail = (%(failed_details)s::text[])[array_position(%(failed_ids)s::bigint[], o.id)]
    WHERE o.id = ANY(%(failed_ids)s::bigint[])
    RETURNING o.id, o.source_execution_id, o.source_position, o.target_execution_id,
              o.signal_name, o.idempotency_key, o.failure_reason, o.failure_detail
)
INSERT INTO shardq.history (execution_id, position, kind, name, payload)
SELECT f.source_execution_id, NULL, 'external.failed', f.signal_name,
       jsonb_build_object('target', f.target_execution_id, 'name', f.signal_name,
                          'idempotency_key', f.idempotency_key, 'position', f.source_position,
                          'outbox_id', f.id, 'reason_code', f.failure_reason,
                          'detail', f.failure_detail)
FROM failed f
ORDER BY f.id

-- name: outbox_backlog
-- A source shard's outbox by target bucket: pending rows, those in retry,
-- permanent failures and the oldest pending row's age. Delivered rows are
-- deleted, so this reads only what is still owed.
SELECT target_bucket,
       count(*) FILTER (WHERE state = 'pending') AS pending,
       count(*) FILTER (WHERE state = 'pending' AND attempts > 0) AS retrying,
       count(*) FILTER (WHERE state = 'failed') AS failed,
       extract(epoch FROM now() - min(queued_at) FILTER (WHERE state = 'pending'))::float8
           AS oldest_pending_s
FROM shardq.outbox
GROUP BY target_bucket

-- name: outbox_failures
-- Permanently failed rows of a source shard, by id, a page after `after`.
SELECT id, source_execution_id, source_position, target_execution_id, tenant, signal_name,
       idempotency_key, attempts, failure_reason, failure_detail, created_at, finished_at
FROM shardq.outbox
WHERE state = 'failed' AND id > %(after)s
ORDER BY id
LIMIT %(limit)s

-- name: requeue_outbox
-- An operator re-queues permanently failed rows (after fixing the cause): due
-- now, attempts and age start over, and the sender's history says so. All or
-- nothing: when one id is not a failed row, none is re-queued.
WITH requeued AS (
    UPDATE shardq.outbox o
    SET state = 'pending', attempts = 0, next_attempt_at = now(), queued_at = now(),
        finished_at = NULL
    WHERE o.id = ANY(%(ids)s::bigint[]) AND o.state = 'failed'
      AND (SELECT count(*) FROM shardq.outbox f
           WHERE f.id = ANY(%(ids)s::bigint[]) AND f.state = 'failed')
          = (SELECT count(DISTINCT i) FROM unnest(%(ids)s::bigint[]) AS i)
    RETURNING o.id, o.source_execution_id, o.source_position, o.target_execution_id,
              o.signal_name, o.failure_reason
), recorded AS (
    INSERT INTO shardq.history (execution_id, position, kind, name, payload)
    SELECT r.source_execution_id, NULL, 'external.requeued', r.signal_name,
           jsonb_build_object('target', r.target_execution_id, 'position', r.source_position,
                              'outbox_id', r.id, 'after', r.failure_reason)
    FROM requeued r
), notified AS (
    SELECT pg_notify(shardq.outbox_channel(), '') FROM requeued LIMIT 1
)
SELECT r.id FROM requeued r LEFT JOIN notified ON true
