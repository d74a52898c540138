-- What ending these runs (their outcome events just written) means for their
-- families (schema/0023): each child's outcome goes to its parent, and each
-- parent's live children of policy `cancel` are asked to cancel.
--
-- Outcomes to parents whose buckets are writable here are delivered in this
-- transaction, one deliver_signals call per tenant for all of them (the
-- parents' rows locked in id order there); the others get an outbox row each.
-- Cancels always go through the outbox, to a child of this shard too: a
-- parent's commit never locks a child's rows, so it cannot close a lock cycle
-- with the child's own commit, which locks the parent's. Set-based: a batch of
-- a thousand ended children is a handful of statements.
--
-- Every statement here finds rows by key; a plan made while the shard was
-- small, and kept (commit_turns_v2 plans once per connection), scanned the
-- runs instead and compared each with every ended id: a fan-in's children
-- ending on a shard that was filling up spent 18 ms a batch of 100 here.
CREATE OR REPLACE FUNCTION shardq.runs_ended(p_ids uuid[]) RETURNS void
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off SET jit = off AS $$
DECLARE
    own_writable bit(4096);
    queued       bigint := 0;
    added        bigint;
    r            record;
BEGIN
    SELECT o.writable INTO own_writable FROM shardq.ownership o;
    FOR r IN
        SELECT m.tenant, array_agg(m.parent ORDER BY m.parent, m.child) AS parents,
               array_agg(m.body ORDER BY m.parent, m.child) AS bodies,
               array_agg(m.key ORDER BY m.parent, m.child) AS keys
        FROM shardq.child_outcomes(p_ids) m
        WHERE own_writable IS NULL OR get_bit(own_writable, shardq.bucket(m.parent)) = 1
        GROUP BY m.tenant
    LOOP
        PERFORM shardq.deliver_signals(
            r.tenant, r.parents, array_fill('shardq:run:child'::text,
                                            ARRAY[cardinality(r.parents)]),
            r.bodies, r.keys, 1, 1, NULL::text[]);
    END LOOP;

    INSERT INTO shardq.outbox (source_execution_id, source_position, target_execution_id,
                               target_bucket, tenant, signal_name, payload, idempotency_key)
    SELECT m.child, -1, m.parent, shardq.bucket(m.parent)::smallint, m.tenant,
           'shardq:run:child', m.body, m.key
    FROM shardq.child_outcomes(p_ids) m
    WHERE own_writable IS NOT NULL AND get_bit(own_writable, shardq.bucket(m.parent)) = 0
    ORDER BY m.child
    ON CONFLICT (source_execution_id, source_position) DO NOTHING;
    GET DIAGNOSTICS added = ROW_COUNT;
    queued := queued + added;

    -- A parent's cancel of the child it started at position p goes at -2 - p
    -- (send_control's positions).
    INSERT INTO shardq.outbox (source_execution_id, source_position, target_execution_id,
                               target_bucket, tenant, signal_name, payload, idempotency_key)
    SELECT c.parent_id, -2 - c.position, c.child_id, shardq.bucket(c.child_id)::smallint,
           x.tenant, 'shardq:run:cancel', jsonb_build_object('parent', c.parent_id),
           'cancel:' || c.child_id
    FROM shardq.children c JOIN shardq.executions x ON x.id = c.parent_id
    WHERE c.parent_id = ANY(p_ids) AND c.ended IS NULL AND c.policy = 'cancel'
    ORDER BY c.parent_id, c.position
    ON CONFLICT (source_execution_id, source_position) DO NOTHING;
    GET DIAGNOSTICS added = ROW_COUNT;
    queued := queued + added;

    IF queued > 0 THEN
        PERFORM pg_notify(shardq.outbox_channel(), '');
    END IF;
END
$$;
