-- Fairness between tenants (docs/flow-control.md, docs/design/flow-control.md
-- section 3): a claim's priority-0 share of its batch is divided between the
-- tenants that have due work, by weight (1 unless an operator set one), so a
-- tenant that floods the queue gets its share and the others get theirs.
--
-- A task row carries its run's tenant, copied by every insert as its priority
-- is. `tasks_fair` orders priority-0 rows by tenant, then due time: a claim
-- walks the distinct tenants with one descent each (a loose index scan) and
-- takes each tenant's share from the head of its range, which stops at now(),
-- so a tenant's future timers are never read. The price, paid by every task
-- insert and every heartbeat that moves run_at: one more index entry
-- (measured in docs/flow-control.md). A lease is written to columns no index
-- holds, so claims stay HOT (schema/0018).
--
-- The column's default '' stands for "tenant not known": rows a process older
-- than this migration inserts, which the claim treats as one more tenant.
ALTER TABLE shardq.tasks ADD COLUMN tenant text NOT NULL DEFAULT '';
UPDATE shardq.tasks t SET tenant = e.tenant
FROM shardq.executions e WHERE e.id = t.execution_id;
CREATE INDEX tasks_fair ON shardq.tasks (tenant, run_at) WHERE priority = 0;

-- An operator's weights (`shardq fairness set`), the same on every shard: the
-- CLI writes each shard, and `shardq shards add` copies them to a new one. A
-- tenant with no row weighs 1.
CREATE TABLE shardq.tenant_weights (
    tenant     text PRIMARY KEY,
    weight     integer NOT NULL CHECK (weight BETWEEN 1 AND 1000),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- claim_tasks takes the caller's rotation cursor (the tenant its last claim
-- stopped at): its file creates it again with the parameter.
DROP FUNCTION IF EXISTS shardq.claim_tasks(text, integer, float8, smallint);
