-- A claim writes only columns no index holds, so PostgreSQL can update the
-- task row in place (a HOT update) instead of writing a new version with an
-- entry in tasks_pkey and in tasks_due (issue 29; docs/design/db-cost.md,
-- candidate B: 115-120 WAL bytes fewer per job, measured, and two index
-- entries fewer per claim that finds room on its page).
--
-- Until here a live lease was run_at = its expiry, which moved the row in
-- tasks_due on every claim. The expiry now has a column of its own, indexed
-- by nothing: a lease is live while leased_until > now(), and a task is
-- claimable when run_at <= now() and its lease is not live. A claimed row
-- keeps its run_at, so it stays at the head of tasks_due while its turn
-- runs and every claim steps over it; the worker's first heartbeat (a third
-- of the lease) moves a long turn's run_at to its expiry, out of the claims'
-- way, as every heartbeat did before. Claims step over at most the leases
-- younger than a heartbeat.
--
-- A whole claim batch updates consecutive rows (run_at order is mostly
-- insert order): the fillfactor leaves each page room for a new version of
-- every row on it, so the update stays on its page.
ALTER TABLE shardq.tasks ADD COLUMN leased_until timestamptz;
UPDATE shardq.tasks SET leased_until = run_at WHERE lease_token IS NOT NULL;
ALTER TABLE shardq.tasks SET (fillfactor = 50);
