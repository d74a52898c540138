-- A child's start carries its parent's trace (core/tracing.py): the starting turn's
-- traceparent rides in the start document, on the outbox row of a child on another
-- shard, and into the child's executions.trace, which its first turn continues. So
-- one trace follows a fan-out into every child.
--
-- child_docs answers the document's trace as one more column: a changed answer, so
-- the function is dropped here and its file creates it again.
DROP FUNCTION IF EXISTS shardq.child_docs(jsonb);
