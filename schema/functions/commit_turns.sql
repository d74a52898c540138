-- The releases before commit_turns_v2 call this name with the whole batch as
-- one jsonb document; kept, as a wrapper that unpacks the document into v2's
-- arrays, while a rolling deploy may run them (README, "Storage"). The
-- document holds one array of rows per kind of write; every key but `c` is
-- left out when it would be empty:
--   c: [id, token, next, state, output, error, action, delay, close_wait]
--      output: the output's JSON text (a string), or null when none is set
--   e: [execution_id, position, kind, name, payload, wake_in]
--   w: [execution_id, position, kind, name, deadline_in, request]
--   s: [signal_id, position]
--   p: [execution_id, signal_name]
--   x, o: as commit_turns_v2's `rare` document.
CREATE OR REPLACE FUNCTION shardq.commit_turns(lease_s float8, batch jsonb)
RETURNS TABLE (commit_ord integer, cancel_requested boolean, externals jsonb)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    c_ids           uuid[];
    c_tokens        uuid[];
    c_next          uuid[];
    c_states        text[];
    c_outputs       jsonb[];
    c_errors        jsonb[];
    c_actions       text[];
    c_delays        float8[];
    c_close_wait    boolean[];
    e_ids           uuid[] := '{}';
    e_positions     integer[];
    e_kinds         text[];
    e_names         text[];
    e_payloads      jsonb[];
    e_wake_ins      float8[];
    w_ids           uuid[] := '{}';
    w_positions     integer[];
    w_kinds         text[];
    w_names         text[];
    w_deadline_ins  float8[];
    w_requests      jsonb[];
    s_ids           bigint[] := '{}';
    s_positions     integer[];
    p_ids           uuid[] := '{}';
    p_names         text[];
BEGIN
    SELECT coalesce(array_agg((r->>0)::uuid ORDER BY o), '{}'),
           array_agg((r->>1)::uuid ORDER BY o),
           array_agg((r->>2)::uuid ORDER BY o),
           array_agg(r->>3 ORDER BY o),
           array_agg(CASE WHEN jsonb_typeof(r->4) = 'string' THEN (r->>4)::jsonb END ORDER BY o),
           array_agg(nullif(r->5, 'null') ORDER BY o),
           array_agg(r->>6 ORDER BY o),
           array_agg((r->>7)::float8 ORDER BY o),
           array_agg((r->>8)::boolean ORDER BY o)
    INTO c_ids, c_tokens, c_next, c_states, c_outputs, c_errors, c_actions, c_delays,
         c_close_wait
    FROM jsonb_array_elements(batch->'c') WITH ORDINALITY AS x(r, o);

    -- The other kinds are absent from the document when the batch has none.
    IF batch ? 'e' THEN
        SELECT coalesce(array_agg((r->>0)::uuid ORDER BY o), '{}'),
               array_agg((r->>1)::integer ORDER BY o),
               array_agg(r->>2 ORDER BY o),
               array_agg(r->>3 ORDER BY o),
               array_agg(r->4 ORDER BY o),
               array_agg((r->>5)::float8 ORDER BY o)
        INTO e_ids, e_positions, e_kinds, e_names, e_payloads, e_wake_ins
        FROM jsonb_array_elements(batch->'e') WITH ORDINALITY AS x(r, o);
    END IF;

    IF batch ? 'w' THEN
        SELECT coalesce(array_agg((r->>0)::uuid ORDER BY o), '{}'),
               array_agg((r->>1)::integer ORDER BY o),
               array_agg(r->>2 ORDER BY o),
               array_agg(r->>3 ORDER BY o),
               array_agg((r->>4)::float8 ORDER BY o),
               array_agg(nullif(r->5, 'null') ORDER BY o)
        INTO w_ids, w_positions, w_kinds, w_names, w_deadline_ins, w_requests
        FROM jsonb_array_elements(batch->'w') WITH ORDINALITY AS x(r, o);
    END IF;

    IF batch ? 's' THEN
        SELECT coalesce(array_agg((r->>0)::bigint ORDER BY o), '{}'),
               array_agg((r->>1)::integer ORDER BY o)
        INTO s_ids, s_positions
        FROM jsonb_array_elements(batch->'s') WITH ORDINALITY AS x(r, o);
    END IF;

    IF batch ? 'p' THEN
        SELECT coalesce(array_agg((r->>0)::uuid ORDER BY o), '{}'), array_agg(r->>1 ORDER BY o)
        INTO p_ids, p_names
        FROM jsonb_array_elements(batch->'p') WITH ORDINALITY AS x(r, o);
    END IF;

    RETURN QUERY
    SELECT v.commit_ord, v.cancel_requested, v.externals
    FROM shardq.commit_turns_v2(
        lease_s, c_ids, c_tokens, c_next, c_states, c_outputs, c_errors, c_actions, c_delays,
        c_close_wait, e_ids, e_positions, e_kinds, e_names, e_payloads, e_wake_ins, w_ids,
        w_positions, w_kinds, w_names, w_deadline_ins, w_requests, s_ids, s_positions, p_ids,
        p_names, nullif(batch - ARRAY['c', 'e', 'w', 's', 'p'], '{}'::jsonb)) AS v;
END
$$;
