-- Concurrency limits per key (docs/flow-control.md, docs/design/flow-control.md).
--
-- A run started with a concurrency key is placed by the key (its bucket is the
-- key's), so every run of one key, its limit row and its waiting queue live on
-- one shard, and admission is one shard's transaction. A keyed run's task row
-- is its slot: a task row is inserted only while the key holds fewer than its
-- limit (shardq.admit_task, a BEFORE INSERT trigger, counts them in the key's
-- row, `held`); otherwise the run waits in key_queue, which no claim reads, so
-- runs waiting for a slot cost a claim nothing. When a keyed task row goes (the
-- run finished, parked on a signal or a person, or was cancelled), its writer
-- gives the slot back (shardq.release_slots), and the key's next queued run
-- gets it in the same transaction. A lease that expires keeps its row, so a
-- dead worker's slot is held until its run is claimed again and ends, never
-- given to another run while the lease could still be live.
--
-- Unkeyed runs pay nothing: the columns are NULL (no rewrite), no index reads
-- them, and the admission trigger has a WHEN clause the executor checks
-- without calling a function.

-- The run's key, and the limit its start declared: admission re-creates a key's
-- row from it when the key's row went idle and was deleted (purge_idle_keys).
ALTER TABLE shardq.executions ADD COLUMN concurrency_key text,
                              ADD COLUMN concurrency_limit integer;
ALTER TABLE shardq.tasks ADD COLUMN concurrency_key text;

-- A key's limit: the one its latest start declared, unless an operator set one
-- (`shardq limits set`), which wins until reset; `held`, the key's task rows
-- (kept by admission and by every release, so admission reads one row, not an
-- index of every slot a busy key ever held). `bucket` is the key's, so a move copies and
-- cleans the row with the bucket's runs. No index holds `held`, which changes
-- on every admission and release: those updates stay HOT.
CREATE TABLE shardq.concurrency_keys (
    key        text PRIMARY KEY,
    bucket     integer NOT NULL,
    declared   integer NOT NULL CHECK (declared > 0),
    override   integer CHECK (override > 0),
    held       integer NOT NULL DEFAULT 0 CHECK (held >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 70);
CREATE INDEX concurrency_keys_bucket ON shardq.concurrency_keys (bucket);
-- The housekeeping's scan for idle keys (purge_idle_keys). updated_at changes
-- when a start declares the key, not when a slot is taken or given back.
CREATE INDEX concurrency_keys_idle ON shardq.concurrency_keys (updated_at);

-- Runs due but waiting for a slot of their key, promoted highest priority
-- first, then oldest. `claims` is the task row's as it would have been
-- inserted (0: a new run, whose first claim reads no history). A queue: rows
-- come and go as slots free, so it is vacuumed as often as tasks.
CREATE TABLE shardq.key_queue (
    execution_id    uuid PRIMARY KEY,
    concurrency_key text NOT NULL,
    priority        smallint NOT NULL,
    claims          integer NOT NULL,
    queued_at       timestamptz NOT NULL DEFAULT now()
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);
CREATE INDEX key_queue_next ON shardq.key_queue (concurrency_key, priority DESC, queued_at);

-- The trigger's body is schema/functions/admit_task.sql, applied after the
-- migrations (or already, by a migrator that applies the functions first); a
-- stub, where there is none yet, lets the trigger be created here.
DO $do$
BEGIN
    IF to_regprocedure('shardq.admit_task()') IS NULL THEN
        CREATE FUNCTION shardq.admit_task() RETURNS trigger LANGUAGE plpgsql
        AS $$ BEGIN RETURN NEW; END $$;
    END IF;
END
$do$;

-- A writer that counts slots itself sets shardq.slots_counted for the
-- statement: a move copying rows as they are, shardq.fill_slots promoting
-- queued runs it has counted. Checked only for keyed rows (AND stops at the
-- first false). Releases have no trigger: every statement that deletes task
-- rows outside a move gives their slots back itself (shardq.release_slots),
-- a batch at a time, where an AFTER DELETE row trigger would fetch every
-- deleted row of every run, keyed or not, once more.
CREATE TRIGGER tasks_admit BEFORE INSERT ON shardq.tasks
    FOR EACH ROW WHEN (NEW.concurrency_key IS NOT NULL
                       AND current_setting('shardq.slots_counted', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION shardq.admit_task();

-- signal_with_start_v2 takes the new run's concurrency key, and finish_tasks
-- answers each deleted row's key: their files create them again.
DROP FUNCTION IF EXISTS shardq.signal_with_start_v2(
    text, text, integer, text, uuid, jsonb, text, jsonb, text, integer, integer, text[], smallint);
DROP FUNCTION IF EXISTS shardq.finish_tasks(uuid[], uuid[]);
