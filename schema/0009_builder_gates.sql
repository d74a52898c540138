-- Gates of declarative workflows (workflow/builder.py): the signal names a run
-- takes once. Written with the run, never after (NULL for code-first runs); a
-- second signal of a gate's name is refused (first writer wins).
ALTER TABLE shardq.executions ADD COLUMN gates text[];

-- deliver_signals(..., origins) gains a column in its answer (gate_closed).
-- That arity was added in this release and no release before it calls it,
-- so it is dropped here and its file creates it again; the old arity, which
-- earlier releases call, is re-created by the same file over the new one.
DROP FUNCTION IF EXISTS shardq.deliver_signals(
    text, uuid[], text[], jsonb[], text[], integer, integer, text[]);
