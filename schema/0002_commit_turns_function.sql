-- replaces checksum: a9a527421d78cc6b0e01a148d0cf33c77959ae6c37b02f4d77616b8386c3fb87
--
-- This migration also created the first commit_turns(); function bodies now
-- live in schema/functions/ (re-applied when they change), so shards that
-- ran the original keep its bookkeeping row and new shards run only what is
-- left here.

-- The per-attempt stamp the pipelined batch needed; the function keeps the
-- fenced ids in a variable instead.
ALTER TABLE shardq.executions DROP COLUMN commit_attempt;
