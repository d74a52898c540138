-- Create child runs (schema/0023): each document names the child's id (the
-- parent chose it, so a start sent twice finds its run), its parent and the
-- parent's call position, the tenant (the parent's), the workflow and its
-- version, the workflow id, input, priority and gates.
--
-- A new child's task row counts one claim already: its first claim reads its
-- history, whose `child.of` event names its parent (what the worker tells its
-- commits, so the child's end reaches the parent). A workflow key another run
-- holds refuses that child: the parent is sent the child's failure
-- (ChildStartRefused), which its wait then finds, in this transaction or
-- through the outbox (send_control). A key its own child holds (the start sent
-- again) is no refusal and starts nothing. Both the parent's commit and the
-- relay's delivery start children here.
CREATE OR REPLACE FUNCTION shardq.start_child_runs(p_docs jsonb) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    created integer;
    queued  boolean := false;
    top     smallint;
    skipped uuid[];
    r       record;
BEGIN
    -- One statement, the created runs joined by hash: a filter `id = ANY(created)`
    -- per row was quadratic, 10^8 comparisons for 10,000 children.
    WITH doc AS MATERIALIZED (
        SELECT * FROM shardq.child_docs(p_docs)
    ), inserted AS (
        -- A child takes its own workflow's current build (schema/0026), as any start.
        -- Its trace is the starting turn's: the child's first turn continues it.
        INSERT INTO shardq.executions (id, tenant, workflow_name, workflow_version, workflow_id,
                                       input, gates, priority, parent_id, build_id, pinned,
                                       trace)
        SELECT d.id, d.tenant, d.workflow, d.version, d.workflow_id, d.input, d.gates,
               d.priority, d.parent, b.build_id, coalesce(b.pinned, false), d.trace
        FROM doc d LEFT JOIN shardq.workflow_builds b ON b.workflow_name = d.workflow
        ORDER BY d.o
        ON CONFLICT (tenant, workflow_name, workflow_id) DO NOTHING
        RETURNING id, CASE WHEN pinned THEN build_id END AS task_build
    ), made AS MATERIALIZED (
        SELECT d.*, i.task_build FROM doc d JOIN inserted i ON i.id = d.id
    ), queued AS (
        INSERT INTO shardq.tasks (execution_id, run_at, claims, priority, tenant, build_id)
        SELECT m.id, now(), 1, m.priority, m.tenant, m.task_build FROM made m
    ), marked AS (
        INSERT INTO shardq.history (execution_id, position, kind, name, payload)
        SELECT m.id, NULL, 'child.of', m.workflow_id,
               jsonb_build_object('parent', m.parent, 'position', m.pos)
        FROM made m ORDER BY m.o
    )
    SELECT count(*), max(m.priority),
           (SELECT array_agg(d.id) FROM doc d LEFT JOIN made k ON k.id = d.id
            WHERE k.id IS NULL)
    INTO created, top, skipped FROM made m;

    IF created > 0 THEN
        PERFORM pg_notify(shardq.wake_channel(), shardq.wake_note(top));
    END IF;

    -- Only a child the insert skipped can be refused: its key was held, by
    -- another run or by itself (the start sent again), usually by none. A
    -- statement of its own: it sees a key a racing start committed meanwhile.
    IF skipped IS NULL THEN
        RETURN;
    END IF;
    FOR r IN
        SELECT d.id, d.parent, d.tenant, d.workflow, d.workflow_id, x.id AS holder
        FROM shardq.child_docs(p_docs) d
        JOIN shardq.executions x
          ON x.tenant = d.tenant AND x.workflow_name = d.workflow
         AND x.workflow_id = d.workflow_id
        WHERE d.id = ANY(skipped) AND x.id <> d.id
        ORDER BY d.o
    LOOP
        queued := shardq.send_control(
            r.id, -1, r.parent, r.tenant, 'shardq:run:child',
            jsonb_build_object(
                'child', r.id, 'workflow', r.workflow, 'workflow_id', r.workflow_id,
                'state', 'failed',
                'error', jsonb_build_object('type', 'ChildStartRefused', 'message', format(
                    'workflow id %L of %s is taken by run %s, not a child of this run',
                    r.workflow_id, r.workflow, r.holder))),
            'child:' || r.id, true) OR queued;
    END LOOP;
    IF queued THEN
        PERFORM pg_notify(shardq.outbox_channel(), '');
    END IF;
END
$$;
