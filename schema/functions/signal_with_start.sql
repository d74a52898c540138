-- The signature releases before signal_with_start_v2 call: a run started here
-- has no gates, and the answer has no gate_closed. Kept while a rolling
-- deploy may run those releases (see README, "Storage").
CREATE OR REPLACE FUNCTION shardq.signal_with_start(
    p_tenant text, p_workflow_name text, p_workflow_version integer, p_workflow_id text,
    p_new_id uuid, p_input jsonb, p_name text, p_payload jsonb, p_key text,
    p_max_pending integer, p_max_pending_total integer
) RETURNS TABLE (
    execution_id uuid, created boolean, tenant text, finished text, earlier_id bigint,
    earlier_name text, pending bigint, pending_total bigint, signal_id bigint
)
LANGUAGE sql VOLATILE AS $$
    SELECT s.execution_id, s.created, s.tenant, s.finished, s.earlier_id, s.earlier_name,
           s.pending, s.pending_total, s.signal_id
    FROM shardq.signal_with_start_v2(p_tenant, p_workflow_name, p_workflow_version,
                                     p_workflow_id, p_new_id, p_input, p_name, p_payload, p_key,
                                     p_max_pending, p_max_pending_total, NULL::text[]) AS s
$$;
