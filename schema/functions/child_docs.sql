-- The child starts of a JSON array (see start_child_runs) as rows, `o`
-- numbering them from 1. A SQL function of one SELECT: inlined where it is used.
-- `trace`: the starting turn's traceparent (schema/0027), NULL when tracing is off
-- or the parent's worker predates it.
CREATE OR REPLACE FUNCTION shardq.child_docs(p_docs jsonb)
RETURNS TABLE (id uuid, parent uuid, pos integer, tenant text, workflow text,
               version integer, workflow_id text, input jsonb, priority smallint,
               gates text[], trace text, o bigint)
LANGUAGE sql IMMUTABLE AS $$
    SELECT (d->>'id')::uuid, (d->>'parent')::uuid, (d->>'position')::integer, d->>'tenant',
           d->>'workflow', (d->>'version')::integer, d->>'workflow_id', d->'input',
           coalesce((d->>'priority')::smallint, 0::smallint),
           CASE WHEN jsonb_typeof(d->'gates') = 'array'
                THEN ARRAY(SELECT jsonb_array_elements_text(d->'gates')) END,
           d->>'trace', x.o
    FROM jsonb_array_elements(p_docs) WITH ORDINALITY AS x(d, o)
$$;
