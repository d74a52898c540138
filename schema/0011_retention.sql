-- Retention: finished runs are found oldest first by when they finished (their
-- outcome event), so a purge batch is an index range scan however many runs
-- are live.
CREATE INDEX history_finished ON shardq.history (recorded_at)
    WHERE kind IN ('run.completed', 'run.failed', 'run.cancelled', 'run.timed_out');
