-- What ending these runs (their outcome events just written) means for their
-- families (schema/0023): each child's outcome goes to its parent, and each
-- parent's live children of policy `cancel` are asked to cancel.
--
-- Outcomes to parents whose buckets are writable here are delivered in this
-- transaction, by one deliver_outcomes call per tenant for all of them, under
-- the parents' task and executions rows (locked here in id order, the order
-- deliver_signals takes; a worker's commit took them already, with the rest of
-- its locks, and taking them again costs nothing). The other outcomes get an
-- outbox row each. Cancels always go through the outbox, to a child of this
-- shard too: a parent's commit never locks a child's rows, so it cannot close
-- a lock cycle with the child's own commit, which locks the parent's.
-- Set-based: a batch of a thousand ended children is a handful of statements.
--
-- The outcomes are read once (child_outcomes joins each child to its outcome
-- event) and split by where their parents are. They went through
-- deliver_signals and deliver_control before, as the relay's do: that fenced
-- each outcome's parent again and copied the batch's arrays twice, a fifth of a
-- fan-in's commit time for 10,000 children (docs/composition.md, "Measured").
-- The fence is this function's own ownership read, taken after the
-- transaction's xid (shardq.fence says why that order).
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
    parents      uuid[];
    r            record;
BEGIN
    PERFORM pg_current_xact_id();
    SELECT o.writable INTO own_writable FROM shardq.ownership o;
    FOR r IN
        SELECT m.tenant, m.here,
               array_agg(m.parent ORDER BY m.parent, m.child) AS parents,
               array_agg(m.child ORDER BY m.parent, m.child) AS children,
               array_agg(m.body ORDER BY m.parent, m.child) AS bodies,
               array_agg(m.key ORDER BY m.parent, m.child) AS keys
        FROM (SELECT o.*, own_writable IS NULL
                          OR get_bit(own_writable, shardq.bucket(o.parent)) = 1 AS here
              FROM shardq.child_outcomes(p_ids) o) m
        GROUP BY m.tenant, m.here
        ORDER BY m.here DESC, m.tenant
    LOOP
        IF r.here THEN
            parents := ARRAY(SELECT DISTINCT unnest(r.parents));
            PERFORM shardq.lock_runs(parents, parents);
            PERFORM shardq.deliver_outcomes(r.tenant, r.parents, r.bodies, r.keys, NULL);
        ELSE
            INSERT INTO shardq.outbox (source_execution_id, source_position,
                                       target_execution_id, target_bucket, tenant,
                                       signal_name, payload, idempotency_key)
            SELECT m.child, -1, m.parent, shardq.bucket(m.parent)::smallint, r.tenant,
                   'shardq:run:child', m.body, m.key
            FROM unnest(r.children, r.parents, r.bodies, r.keys) AS m(child, parent, body, key)
            ORDER BY m.child
            ON CONFLICT (source_execution_id, source_position) DO NOTHING;
            GET DIAGNOSTICS added = ROW_COUNT;
            queued := queued + added;
        END IF;
    END LOOP;

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
