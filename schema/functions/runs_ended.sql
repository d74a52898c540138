-- What ending these runs (their outcome events just written) means for their
-- families (schema/0023): a child's outcome goes to its parent (in this
-- transaction when the parent's bucket is writable here, else through the
-- outbox), and a parent's live children of policy `cancel` are asked to
-- cancel, always through the outbox: a parent's commit never locks a child's
-- rows, so it cannot close a lock cycle with the child's own commit, which
-- locks the parent's. Runs of neither kind cost a probe of each table.
CREATE OR REPLACE FUNCTION shardq.runs_ended(p_ids uuid[]) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    queued boolean := false;
    r      record;
BEGIN
    FOR r IN
        SELECT x.id, x.parent_id, x.tenant, x.workflow_name, x.workflow_id,
               substr(o.kind, 5) AS state, o.payload
        FROM shardq.executions x
        JOIN shardq.history o ON o.execution_id = x.id
             AND o.kind IN ('run.completed', 'run.failed', 'run.cancelled', 'run.timed_out')
        WHERE x.id = ANY(p_ids) AND x.parent_id IS NOT NULL
        ORDER BY x.id
    LOOP
        queued := shardq.send_control(
            r.id, -1, r.parent_id, r.tenant, 'shardq:run:child',
            jsonb_build_object('child', r.id, 'workflow', r.workflow_name,
                               'workflow_id', r.workflow_id, 'state', r.state)
            || CASE WHEN r.state = 'completed'
                    THEN jsonb_build_object('output', r.payload->'output')
                    ELSE jsonb_build_object('error', r.payload->'error') END,
            'child:' || r.id, true) OR queued;
    END LOOP;

    FOR r IN
        SELECT c.parent_id, c.child_id, c.position, x.tenant
        FROM shardq.children c JOIN shardq.executions x ON x.id = c.parent_id
        WHERE c.parent_id = ANY(p_ids) AND c.ended IS NULL AND c.policy = 'cancel'
        ORDER BY c.parent_id, c.position
    LOOP
        queued := shardq.send_control(
            r.parent_id, -2 - r.position, r.child_id, r.tenant, 'shardq:run:cancel',
            jsonb_build_object('parent', r.parent_id), 'cancel:' || r.child_id, false)
            OR queued;
    END LOOP;

    IF queued THEN
        PERFORM pg_notify(shardq.outbox_channel(), '');
    END IF;
END
$$;
