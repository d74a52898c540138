-- A signal's arrival time is when its row is written, not when its sender's
-- transaction began. A timed wait's outcome is decided by comparing it with the
-- wait's deadline (schema/functions/defer_premature_timeouts.sql): a sender that
-- began before the deadline, then waited on the run's lock behind the commit
-- that recorded the timeout, would otherwise be stored as having arrived in time
-- for a wait that had already given up.
ALTER TABLE shardq.signals ALTER COLUMN received_at SET DEFAULT clock_timestamp();
