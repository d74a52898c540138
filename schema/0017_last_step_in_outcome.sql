-- A run that ends in the same commit as its last step stores that step inside
-- its outcome event: one history row instead of two (issue 29; measured in
-- docs/design/db-cost.md, candidate A: -180 WAL bytes and one heap row and
-- primary-key entry fewer per one-step job).
--
-- The outcome row's payload carries `step`: [seq, position, name, payload],
-- the step.completed event it stands for. The step keeps a seq of its own,
-- drawn from the history's sequence just before the outcome row's, so every
-- event still has a seq unique in its run and history order is unchanged.
--
-- shardq.events shows the history one row per event, as every API shows it:
-- read it, not shardq.history, wherever events are counted or listed
-- (docs/storage.md, "History").
CREATE VIEW shardq.events AS
SELECT h.execution_id, e.seq, e.position, e.kind, e.name, e.payload, h.recorded_at
FROM shardq.history h
CROSS JOIN LATERAL (
    SELECT (h.payload->'step'->>0)::bigint, (h.payload->'step'->>1)::integer,
           'step.completed'::text, h.payload->'step'->>2, h.payload->'step'->3
    WHERE h.kind IN ('run.completed', 'run.failed', 'run.cancelled', 'run.timed_out')
      AND h.payload ? 'step'
    UNION ALL
    SELECT h.seq, h.position, h.kind, h.name,
           CASE WHEN h.kind IN ('run.completed', 'run.failed', 'run.cancelled', 'run.timed_out')
                THEN h.payload - 'step' ELSE h.payload END
) AS e(seq, position, kind, name, payload);

-- The batch commit takes each commit's folded step (schema/functions/
-- commit_turns_v2.sql). No release has shipped, so the function changes in
-- place (docs/storage.md, "SQL functions and rolling deploys").
DROP FUNCTION IF EXISTS shardq.commit_turns_v2(
    float8,
    uuid[], uuid[], uuid[], text[], jsonb[], jsonb[], text[], float8[], boolean[],
    uuid[], integer[], text[], text[], jsonb[], float8[],
    uuid[], integer[], text[], text[], float8[], jsonb[],
    bigint[], integer[],
    uuid[], text[],
    jsonb
);
