-- Lock up to `p_limit` due outbox rows for delivery, skipping rows another relay
-- holds (outbox/relay.py). A row is due only when it is the first pending row
-- from its sender to its target, so one sender's signals to one target arrive in
-- send order. The row locks are the relay's lease: held until its transaction
-- settles the rows, gone with its connection if it dies. Rows of a sender a move
-- froze or moved away are not this shard's to send: the copy on the sender's new
-- shard is.
--
-- Why a function, and why without nested loops: its plan must stay linear in the
-- pending rows whatever the statistics say. The outbox is mostly empty, or holds
-- failed rows, when it is analyzed, so a burst of pending rows is estimated as
-- one row, and any nested loop over them rescans them all for each: the earlier
-- NOT EXISTS probe per row read 18 million rows for 3,000 pending (1-3 s a
-- claim), and 5,000 children's outcomes took 14 s to relay. Each pair's first
-- row is found in one pass in outbox_pair's order and joined by hash; a SQL
-- function with a SET clause is planned at each call, never from a plan cached
-- while the outbox was empty. The returned columns are read for the claimed ids
-- after the lock, in the statement's snapshot: a concurrent change that still
-- leaves a row due (a returning target making it due now) is not seen in them.
CREATE OR REPLACE FUNCTION shardq.claim_outbox(p_limit integer)
RETURNS TABLE (id bigint, source_execution_id uuid, source_position integer,
               target_execution_id uuid, target_bucket smallint, tenant text,
               signal_name text, payload text, idempotency_key text, attempts integer,
               queued_s float8, trace text)
LANGUAGE sql VOLATILE SET enable_nestloop = off SET jit = off AS $$
    WITH claimed AS (
        -- Ids only through the sort and the limit: a row's payload (a child's start
        -- document) is read for the rows claimed, not for every pending row.
        SELECT o.id FROM shardq.outbox o
        WHERE o.id IN (
            SELECT f.id FROM (
                SELECT DISTINCT ON (e.source_execution_id, e.target_execution_id)
                       e.id, e.next_attempt_at
                FROM shardq.outbox e WHERE e.state = 'pending'
                ORDER BY e.source_execution_id, e.target_execution_id, e.id
            ) f WHERE f.next_attempt_at <= now()
        )
          AND o.state = 'pending' AND o.next_attempt_at <= now()
          AND ((SELECT shardq.unclean_writable()) IS NULL
               OR get_bit((SELECT shardq.unclean_writable()),
                          shardq.bucket(o.source_execution_id)) = 1)
        ORDER BY o.next_attempt_at, o.id
        LIMIT p_limit
        FOR UPDATE OF o SKIP LOCKED
    )
    SELECT o.id, o.source_execution_id, o.source_position, o.target_execution_id,
           o.target_bucket, o.tenant, o.signal_name, o.payload::text,
           o.idempotency_key, o.attempts,
           extract(epoch FROM now() - o.queued_at)::float8, o.trace
    FROM shardq.outbox o WHERE o.id = ANY(ARRAY(SELECT c.id FROM claimed c))
    ORDER BY o.next_attempt_at, o.id
$$;
