-- ctx.wait_until parks on a condition: a wait woken by a signal of any of the
-- names in its request ({"signals": [...]}), with an optional deadline.
ALTER TABLE shardq.waits DROP CONSTRAINT waits_kind_check;
ALTER TABLE shardq.waits ADD CONSTRAINT waits_kind_check
    CHECK (kind IN ('timer', 'signal', 'condition', 'interrupt'));
