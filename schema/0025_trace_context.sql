-- Trace context (core/tracing.py, docs/operations.md "Tracing"): a W3C
-- traceparent kept beside what it describes, so a trace crosses processes and
-- shards with the work. NULL whenever tracing is off (no opentelemetry-api, or
-- no recording span), which costs a NULL bitmap bit. Nullable, no default: no
-- table is rewritten.
--
-- - executions.trace: the start's span; a run's first turn continues it.
-- - signals.trace: the sender's span (a client's signal, a relay's delivery, a
--   sending run's turn); the turn that consumes it continues it.
-- - outbox.trace: the sending turn's span; the relay's delivery continues it and
--   hands its own to the signal it writes on the target's shard.
ALTER TABLE shardq.executions ADD COLUMN trace text;
ALTER TABLE shardq.signals ADD COLUMN trace text;
ALTER TABLE shardq.outbox ADD COLUMN trace text;

-- deliver_signals takes each signal's trace (a last argument, NULL when left
-- out). No release has shipped, so the function changes in place
-- (docs/storage.md, "SQL functions and rolling deploys"); its file recreates it.
DROP FUNCTION IF EXISTS shardq.deliver_signals(
    text, uuid[], text[], jsonb[], text[], integer, integer, text[]);

-- claim_tasks answers with the start's trace as a last column (and each pending
-- signal's trace as the last element of its array): a changed answer, so the
-- function is dropped here and its file creates it again.
DROP FUNCTION IF EXISTS shardq.claim_tasks(text, integer, float8, smallint, text);
