-- The outcome each of these runs that is a child sends its parent, once its
-- outcome event is written (runs_ended): the parent, the tenant, the message
-- body (deliver_outcomes reads it) and its key, child:<id>, which makes it land
-- once. Runs that are no children, or have not ended, give no row. A SQL
-- function of one SELECT: inlined where it is used.
CREATE OR REPLACE FUNCTION shardq.child_outcomes(p_ids uuid[])
RETURNS TABLE (child uuid, parent uuid, tenant text, body jsonb, key text)
LANGUAGE sql STABLE AS $$
    SELECT x.id, x.parent_id, x.tenant,
           jsonb_build_object('child', x.id, 'workflow', x.workflow_name,
                              'workflow_id', x.workflow_id, 'state', substr(o.kind, 5))
           || CASE WHEN o.kind = 'run.completed'
                   THEN jsonb_build_object('output', o.payload->'output')
                   ELSE jsonb_build_object('error', o.payload->'error') END,
           'child:' || x.id
    FROM shardq.executions x
    JOIN shardq.history o ON o.execution_id = x.id
         AND o.kind IN ('run.completed', 'run.failed', 'run.cancelled', 'run.timed_out')
    WHERE x.id = ANY(p_ids) AND x.parent_id IS NOT NULL
$$;
