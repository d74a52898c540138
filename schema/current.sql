-- The schema every shard has once `shardq migrate` ran: tables, constraints,
-- indexes, views' columns and function signatures, printed from the catalogs of a shard
-- migrated from scratch. Generated, never edited: tests/migration/test_migrations.py
-- fails when the migrations and this picture disagree, and rewrites it with
--   SHARDQ_WRITE_SCHEMA=1 bash bin/test.sh tests/migration/test_migrations.py -k current
-- How it came to be: the numbered files beside it. Function bodies:
-- schema/functions/.

CREATE TABLE shardq.applied_batches (
    move_id bigint NOT NULL,
    batch integer NOT NULL,
    map_version bigint NOT NULL,
    switched_at timestamp with time zone NOT NULL DEFAULT now()
);

CREATE TABLE shardq.children (
    parent_id uuid NOT NULL,
    child_id uuid NOT NULL,
    position integer NOT NULL,
    workflow_name text NOT NULL,
    workflow_id text NOT NULL,
    policy text NOT NULL,
    ended text
) WITH (fillfactor=90);

CREATE TABLE shardq.concurrency_keys (
    key text NOT NULL,
    bucket integer NOT NULL,
    declared integer NOT NULL,
    override integer,
    held integer NOT NULL DEFAULT 0,
    updated_at timestamp with time zone NOT NULL DEFAULT now()
) WITH (fillfactor=70);

CREATE TABLE shardq.ended_runs (
    tenant text NOT NULL,
    state text NOT NULL,
    execution_id uuid NOT NULL,
    workflow_name text NOT NULL
) WITH (fillfactor=100);

CREATE TABLE shardq.executions (
    id uuid NOT NULL,
    tenant text NOT NULL,
    workflow_name text NOT NULL,
    workflow_version integer NOT NULL,
    workflow_id text NOT NULL,
    input jsonb NOT NULL,
    created_at timestamp with time zone NOT NULL DEFAULT now(),
    gates text[],
    priority smallint NOT NULL DEFAULT 0,
    concurrency_key text,
    concurrency_limit integer,
    parent_id uuid,
    trace text,
    build_id text,
    pinned boolean NOT NULL DEFAULT false
) WITH (fillfactor=100);

CREATE TABLE shardq.history (
    execution_id uuid NOT NULL,
    seq bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    position integer,
    kind text NOT NULL,
    name text NOT NULL,
    payload jsonb NOT NULL DEFAULT '{}'::jsonb,
    recorded_at timestamp with time zone NOT NULL DEFAULT now()
);

CREATE TABLE shardq.key_queue (
    execution_id uuid NOT NULL,
    concurrency_key text NOT NULL,
    priority smallint NOT NULL,
    claims integer NOT NULL,
    queued_at timestamp with time zone NOT NULL DEFAULT now()
) WITH (autovacuum_vacuum_scale_factor=0.01, autovacuum_vacuum_threshold=1000);

CREATE TABLE shardq.move_batches (
    move_id bigint NOT NULL,
    batch integer NOT NULL,
    first_bucket smallint NOT NULL,
    last_bucket smallint NOT NULL,
    phase text NOT NULL,
    planned_runs integer NOT NULL,
    planned_rows bigint NOT NULL,
    runs integer,
    rows_copied bigint,
    paused_ms integer,
    map_version bigint,
    released_at timestamp with time zone
);

CREATE TABLE shardq.moves (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    first_bucket smallint NOT NULL,
    last_bucket smallint NOT NULL,
    source text NOT NULL,
    target text NOT NULL,
    phase text NOT NULL,
    from_version bigint NOT NULL,
    max_batch_runs integer NOT NULL,
    max_batch_rows integer NOT NULL,
    grace_s double precision NOT NULL,
    started_at timestamp with time zone NOT NULL DEFAULT now(),
    updated_at timestamp with time zone NOT NULL DEFAULT now(),
    finished_at timestamp with time zone
);

CREATE TABLE shardq.outbox (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    source_execution_id uuid NOT NULL,
    source_position integer NOT NULL,
    target_execution_id uuid NOT NULL,
    tenant text NOT NULL,
    signal_name text NOT NULL,
    payload jsonb NOT NULL,
    idempotency_key text,
    state text NOT NULL DEFAULT 'pending'::text,
    attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamp with time zone NOT NULL DEFAULT now(),
    failure_reason text,
    failure_detail text,
    created_at timestamp with time zone NOT NULL DEFAULT now(),
    finished_at timestamp with time zone,
    target_bucket smallint NOT NULL,
    queued_at timestamp with time zone NOT NULL DEFAULT now(),
    trace text
) WITH (autovacuum_vacuum_scale_factor=0.02, fillfactor=80);

CREATE TABLE shardq.ownership (
    singleton boolean NOT NULL DEFAULT true,
    deployment uuid NOT NULL,
    map_version bigint NOT NULL,
    writable bit(4096) NOT NULL,
    owned bit(4096) NOT NULL,
    unclean boolean NOT NULL DEFAULT false,
    fence_move bigint,
    fence_target text
);

CREATE TABLE shardq.rate_limiters (
    name text NOT NULL,
    rate integer NOT NULL,
    period_s double precision NOT NULL,
    burst integer NOT NULL,
    o_rate integer,
    o_period_s double precision,
    o_burst integer,
    tat timestamp with time zone NOT NULL DEFAULT now(),
    sat timestamp with time zone NOT NULL DEFAULT now()
) WITH (fillfactor=50);

CREATE TABLE shardq.rate_reservations (
    execution_id uuid NOT NULL,
    position integer NOT NULL,
    attempt integer NOT NULL,
    limiter text NOT NULL,
    at timestamp with time zone NOT NULL
) WITH (autovacuum_vacuum_scale_factor=0.01, autovacuum_vacuum_threshold=1000);

CREATE TABLE shardq.run_attributes (
    execution_id uuid NOT NULL,
    name text NOT NULL,
    tenant text NOT NULL,
    value jsonb NOT NULL,
    text_value text DEFAULT 
CASE
    WHEN (jsonb_typeof(value) = ANY (ARRAY['string'::text, 'boolean'::text])) THEN (value #>> '{}'::text[])
    ELSE NULL::text
END,
    num_value double precision DEFAULT 
CASE
    WHEN (jsonb_typeof(value) = 'number'::text) THEN ((value #>> '{}'::text[]))::double precision
    ELSE NULL::double precision
END
);

CREATE TABLE shardq.run_count_changes (
    tenant text NOT NULL,
    workflow_name text NOT NULL,
    kind text NOT NULL,
    n bigint NOT NULL
) WITH (autovacuum_vacuum_scale_factor=0.01, autovacuum_vacuum_threshold=1000);

CREATE TABLE shardq.run_counts (
    tenant text NOT NULL,
    workflow_name text NOT NULL,
    kind text NOT NULL,
    n bigint NOT NULL
);

CREATE TABLE shardq.schedules (
    name text NOT NULL,
    tenant text NOT NULL,
    workflow_name text NOT NULL,
    input jsonb NOT NULL,
    cron text,
    every_s double precision,
    timezone text NOT NULL,
    overlap text NOT NULL,
    catchup_s double precision NOT NULL,
    paused boolean NOT NULL DEFAULT false,
    next_at timestamp with time zone,
    buffered_at timestamp with time zone,
    triggered_at timestamp with time zone,
    last_tick timestamp with time zone,
    last_run uuid,
    started bigint NOT NULL DEFAULT 0,
    skipped bigint NOT NULL DEFAULT 0,
    missed bigint NOT NULL DEFAULT 0,
    created_at timestamp with time zone NOT NULL DEFAULT now(),
    updated_at timestamp with time zone NOT NULL DEFAULT now()
) WITH (fillfactor=70);

CREATE TABLE shardq.schema_functions (
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone NOT NULL DEFAULT now()
);

CREATE TABLE shardq.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone NOT NULL DEFAULT now()
);

CREATE TABLE shardq.shard_identity (
    singleton boolean NOT NULL DEFAULT true,
    shard_name text NOT NULL,
    fingerprint text NOT NULL,
    layout jsonb NOT NULL,
    recorded_at timestamp with time zone NOT NULL DEFAULT now()
);

CREATE TABLE shardq.shard_maps (
    version bigint NOT NULL,
    layout jsonb NOT NULL,
    created_at timestamp with time zone NOT NULL DEFAULT now()
);

CREATE TABLE shardq.signals (
    id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    execution_id uuid NOT NULL,
    tenant text NOT NULL,
    name text NOT NULL,
    payload jsonb NOT NULL,
    idempotency_key text,
    received_at timestamp with time zone NOT NULL DEFAULT clock_timestamp(),
    consumed_at timestamp with time zone,
    consumed_position integer,
    origin text,
    trace text
);

CREATE TABLE shardq.tasks (
    execution_id uuid NOT NULL,
    run_at timestamp with time zone NOT NULL,
    claims integer NOT NULL DEFAULT 0,
    lease_owner text,
    lease_token uuid,
    cancel_requested boolean NOT NULL DEFAULT false,
    leased_until timestamp with time zone,
    priority smallint NOT NULL DEFAULT 0,
    concurrency_key text,
    tenant text NOT NULL DEFAULT ''::text,
    build_id text
) WITH (autovacuum_analyze_scale_factor=0.02, autovacuum_vacuum_cost_delay=0, autovacuum_vacuum_cost_limit=10000, autovacuum_vacuum_scale_factor=0.01, autovacuum_vacuum_threshold=1000, fillfactor=50);

CREATE TABLE shardq.tenant_weights (
    tenant text NOT NULL,
    weight integer NOT NULL,
    updated_at timestamp with time zone NOT NULL DEFAULT now()
);

CREATE TABLE shardq.waits (
    execution_id uuid NOT NULL,
    position integer NOT NULL,
    kind text NOT NULL,
    name text NOT NULL,
    started_at timestamp with time zone NOT NULL DEFAULT now(),
    deadline timestamp with time zone,
    request jsonb
) WITH (autovacuum_vacuum_scale_factor=0.02, fillfactor=90);

CREATE TABLE shardq.workflow_builds (
    workflow_name text NOT NULL,
    build_id text NOT NULL,
    pinned boolean NOT NULL,
    updated_at timestamp with time zone NOT NULL DEFAULT now()
);

ALTER TABLE shardq.applied_batches ADD CONSTRAINT applied_batches_pkey PRIMARY KEY (move_id, batch);
ALTER TABLE shardq.children ADD CONSTRAINT children_pkey PRIMARY KEY (parent_id, child_id);
ALTER TABLE shardq.children ADD CONSTRAINT children_policy_check CHECK ((policy = ANY (ARRAY['cancel'::text, 'abandon'::text, 'wait'::text])));
ALTER TABLE shardq.concurrency_keys ADD CONSTRAINT concurrency_keys_declared_check CHECK ((declared > 0));
ALTER TABLE shardq.concurrency_keys ADD CONSTRAINT concurrency_keys_held_check CHECK ((held >= 0));
ALTER TABLE shardq.concurrency_keys ADD CONSTRAINT concurrency_keys_override_check CHECK ((override > 0));
ALTER TABLE shardq.concurrency_keys ADD CONSTRAINT concurrency_keys_pkey PRIMARY KEY (key);
ALTER TABLE shardq.ended_runs ADD CONSTRAINT ended_runs_pkey PRIMARY KEY (tenant, state, execution_id);
ALTER TABLE shardq.executions ADD CONSTRAINT executions_pkey PRIMARY KEY (id);
ALTER TABLE shardq.executions ADD CONSTRAINT executions_priority_check CHECK (((priority >= 0) AND (priority <= 9)));
ALTER TABLE shardq.executions ADD CONSTRAINT executions_workflow_key UNIQUE (tenant, workflow_name, workflow_id);
ALTER TABLE shardq.history ADD CONSTRAINT history_pkey PRIMARY KEY (execution_id, seq);
ALTER TABLE shardq.key_queue ADD CONSTRAINT key_queue_pkey PRIMARY KEY (execution_id);
ALTER TABLE shardq.move_batches ADD CONSTRAINT move_batches_batch_check CHECK ((batch >= 0));
ALTER TABLE shardq.move_batches ADD CONSTRAINT move_batches_check CHECK ((first_bucket <= last_bucket));
ALTER TABLE shardq.move_batches ADD CONSTRAINT move_batches_move_id_fkey FOREIGN KEY (move_id) REFERENCES shardq.moves(id);
ALTER TABLE shardq.move_batches ADD CONSTRAINT move_batches_phase_check CHECK ((phase = ANY (ARRAY['planned'::text, 'fenced'::text, 'switched'::text, 'released'::text, 'cleaned'::text, 'rolled_back'::text])));
ALTER TABLE shardq.move_batches ADD CONSTRAINT move_batches_pkey PRIMARY KEY (move_id, batch);
ALTER TABLE shardq.moves ADD CONSTRAINT moves_check CHECK (((last_bucket >= first_bucket) AND (last_bucket <= 4095)));
ALTER TABLE shardq.moves ADD CONSTRAINT moves_check1 CHECK ((target <> source));
ALTER TABLE shardq.moves ADD CONSTRAINT moves_first_bucket_check CHECK (((first_bucket >= 0) AND (first_bucket <= 4095)));
ALTER TABLE shardq.moves ADD CONSTRAINT moves_grace_s_check CHECK ((grace_s >= (0)::double precision));
ALTER TABLE shardq.moves ADD CONSTRAINT moves_max_batch_rows_check CHECK ((max_batch_rows > 0));
ALTER TABLE shardq.moves ADD CONSTRAINT moves_max_batch_runs_check CHECK ((max_batch_runs > 0));
ALTER TABLE shardq.moves ADD CONSTRAINT moves_phase_check CHECK ((phase = ANY (ARRAY['moving'::text, 'cleaning'::text, 'done'::text, 'aborted'::text])));
ALTER TABLE shardq.moves ADD CONSTRAINT moves_pkey PRIMARY KEY (id);
ALTER TABLE shardq.outbox ADD CONSTRAINT outbox_idempotency_key_check CHECK ((idempotency_key <> ''::text));
ALTER TABLE shardq.outbox ADD CONSTRAINT outbox_pkey PRIMARY KEY (id);
ALTER TABLE shardq.outbox ADD CONSTRAINT outbox_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'delivered'::text, 'failed'::text])));
ALTER TABLE shardq.ownership ADD CONSTRAINT ownership_fence_names_both CHECK (((fence_move IS NULL) = (fence_target IS NULL)));
ALTER TABLE shardq.ownership ADD CONSTRAINT ownership_map_version_fkey FOREIGN KEY (map_version) REFERENCES shardq.shard_maps(version);
ALTER TABLE shardq.ownership ADD CONSTRAINT ownership_pkey PRIMARY KEY (singleton);
ALTER TABLE shardq.ownership ADD CONSTRAINT ownership_singleton_check CHECK (singleton);
ALTER TABLE shardq.ownership ADD CONSTRAINT ownership_writable_is_owned CHECK ((bit_count((writable & (~ owned))) = 0));
ALTER TABLE shardq.rate_limiters ADD CONSTRAINT rate_limiters_burst_check CHECK ((burst > 0));
ALTER TABLE shardq.rate_limiters ADD CONSTRAINT rate_limiters_check CHECK ((((o_rate IS NULL) = (o_period_s IS NULL)) AND ((o_rate IS NULL) = (o_burst IS NULL))));
ALTER TABLE shardq.rate_limiters ADD CONSTRAINT rate_limiters_o_burst_check CHECK ((o_burst > 0));
ALTER TABLE shardq.rate_limiters ADD CONSTRAINT rate_limiters_o_period_s_check CHECK ((o_period_s > (0)::double precision));
ALTER TABLE shardq.rate_limiters ADD CONSTRAINT rate_limiters_o_rate_check CHECK ((o_rate > 0));
ALTER TABLE shardq.rate_limiters ADD CONSTRAINT rate_limiters_period_s_check CHECK ((period_s > (0)::double precision));
ALTER TABLE shardq.rate_limiters ADD CONSTRAINT rate_limiters_pkey PRIMARY KEY (name);
ALTER TABLE shardq.rate_limiters ADD CONSTRAINT rate_limiters_rate_check CHECK ((rate > 0));
ALTER TABLE shardq.rate_reservations ADD CONSTRAINT rate_reservations_pkey PRIMARY KEY (execution_id, "position", attempt, limiter);
ALTER TABLE shardq.run_attributes ADD CONSTRAINT run_attributes_pkey PRIMARY KEY (execution_id, name);
ALTER TABLE shardq.run_counts ADD CONSTRAINT run_counts_pkey PRIMARY KEY (tenant, workflow_name, kind);
ALTER TABLE shardq.schedules ADD CONSTRAINT schedules_catchup_s_check CHECK ((catchup_s >= (0)::double precision));
ALTER TABLE shardq.schedules ADD CONSTRAINT schedules_check CHECK (((cron IS NULL) <> (every_s IS NULL)));
ALTER TABLE shardq.schedules ADD CONSTRAINT schedules_every_s_check CHECK ((every_s > (0)::double precision));
ALTER TABLE shardq.schedules ADD CONSTRAINT schedules_overlap_check CHECK ((overlap = ANY (ARRAY['skip'::text, 'buffer_one'::text, 'allow'::text])));
ALTER TABLE shardq.schedules ADD CONSTRAINT schedules_pkey PRIMARY KEY (name);
ALTER TABLE shardq.schema_functions ADD CONSTRAINT schema_functions_pkey PRIMARY KEY (name, checksum);
ALTER TABLE shardq.schema_migrations ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);
ALTER TABLE shardq.shard_identity ADD CONSTRAINT shard_identity_pkey PRIMARY KEY (singleton);
ALTER TABLE shardq.shard_identity ADD CONSTRAINT shard_identity_singleton_check CHECK (singleton);
ALTER TABLE shardq.shard_maps ADD CONSTRAINT shard_maps_layout_check CHECK ((jsonb_typeof(layout) = 'object'::text));
ALTER TABLE shardq.shard_maps ADD CONSTRAINT shard_maps_pkey PRIMARY KEY (version);
ALTER TABLE shardq.shard_maps ADD CONSTRAINT shard_maps_version_check CHECK ((version > 0));
ALTER TABLE shardq.signals ADD CONSTRAINT signals_idempotency_key_check CHECK ((idempotency_key <> ''::text));
ALTER TABLE shardq.signals ADD CONSTRAINT signals_pkey PRIMARY KEY (execution_id, id);
ALTER TABLE shardq.tasks ADD CONSTRAINT tasks_pkey PRIMARY KEY (execution_id);
ALTER TABLE shardq.tenant_weights ADD CONSTRAINT tenant_weights_pkey PRIMARY KEY (tenant);
ALTER TABLE shardq.tenant_weights ADD CONSTRAINT tenant_weights_weight_check CHECK (((weight >= 1) AND (weight <= 1000)));
ALTER TABLE shardq.waits ADD CONSTRAINT waits_kind_check CHECK ((kind = ANY (ARRAY['timer'::text, 'signal'::text, 'condition'::text, 'interrupt'::text, 'children'::text])));
ALTER TABLE shardq.waits ADD CONSTRAINT waits_pkey PRIMARY KEY (execution_id);
ALTER TABLE shardq.workflow_builds ADD CONSTRAINT workflow_builds_pkey PRIMARY KEY (workflow_name);

CREATE INDEX concurrency_keys_bucket ON shardq.concurrency_keys USING btree (bucket);
CREATE INDEX concurrency_keys_idle ON shardq.concurrency_keys USING btree (updated_at);
CREATE INDEX ended_runs_workflow ON shardq.ended_runs USING btree (tenant, workflow_name, state, execution_id);
CREATE INDEX executions_pinned ON shardq.executions USING btree (workflow_name, build_id) WHERE pinned;
CREATE INDEX executions_tenant ON shardq.executions USING btree (tenant, id);
CREATE INDEX executions_workflow ON shardq.executions USING btree (tenant, workflow_name, id);
CREATE INDEX history_finished ON shardq.history USING btree (recorded_at) WHERE (kind = ANY (ARRAY['run.completed'::text, 'run.failed'::text, 'run.cancelled'::text, 'run.timed_out'::text]));
CREATE INDEX history_outcome ON shardq.history USING btree (execution_id, kind) WHERE (kind = ANY (ARRAY['run.completed'::text, 'run.failed'::text, 'run.cancelled'::text, 'run.timed_out'::text]));
CREATE INDEX key_queue_next ON shardq.key_queue USING btree (concurrency_key, priority DESC, queued_at);
CREATE UNIQUE INDEX moves_unfinished ON shardq.moves USING btree ((true)) WHERE (phase = ANY (ARRAY['moving'::text, 'cleaning'::text]));
CREATE INDEX outbox_due ON shardq.outbox USING btree (next_attempt_at) WHERE (state = 'pending'::text);
CREATE INDEX outbox_failed ON shardq.outbox USING btree (id) WHERE (state = 'failed'::text);
CREATE INDEX outbox_pair ON shardq.outbox USING btree (source_execution_id, target_execution_id, id) WHERE (state = 'pending'::text);
CREATE UNIQUE INDEX outbox_source ON shardq.outbox USING btree (source_execution_id, source_position);
CREATE INDEX rate_reservations_waiting ON shardq.rate_reservations USING btree (limiter, at);
CREATE INDEX run_attributes_num ON shardq.run_attributes USING btree (tenant, name, num_value, execution_id) WHERE (num_value IS NOT NULL);
CREATE INDEX run_attributes_text ON shardq.run_attributes USING btree (tenant, name, text_value, execution_id) WHERE (text_value IS NOT NULL);
CREATE INDEX run_count_changes_key ON shardq.run_count_changes USING btree (tenant, workflow_name, kind);
CREATE INDEX schedules_due ON shardq.schedules USING btree (next_at) WHERE (NOT paused);
CREATE INDEX schedules_held ON shardq.schedules USING btree (name) WHERE ((buffered_at IS NOT NULL) OR (triggered_at IS NOT NULL));
CREATE UNIQUE INDEX signals_idempotency ON shardq.signals USING btree (execution_id, idempotency_key) WHERE (idempotency_key IS NOT NULL);
CREATE UNIQUE INDEX signals_origin ON shardq.signals USING btree (execution_id, origin) WHERE (origin IS NOT NULL);
CREATE INDEX signals_pending ON shardq.signals USING btree (execution_id, id) WHERE (consumed_at IS NULL);
CREATE INDEX tasks_due ON shardq.tasks USING btree (run_at) WHERE (build_id IS NULL);
CREATE INDEX tasks_fair ON shardq.tasks USING btree (tenant, run_at) WHERE ((priority = 0) AND (build_id IS NULL));
CREATE INDEX tasks_pinned ON shardq.tasks USING btree (build_id, run_at) WHERE (build_id IS NOT NULL);
CREATE INDEX tasks_pinned_urgent ON shardq.tasks USING btree (build_id, priority DESC, run_at) WHERE ((priority > 0) AND (build_id IS NOT NULL));
CREATE INDEX tasks_urgent ON shardq.tasks USING btree (priority DESC, run_at) WHERE ((priority > 0) AND (build_id IS NULL));
CREATE INDEX waits_age ON shardq.waits USING btree (kind, started_at);
CREATE INDEX waits_deadline ON shardq.waits USING btree (deadline) WHERE (deadline IS NOT NULL);
CREATE INDEX waits_interrupts ON shardq.waits USING btree (started_at, execution_id) WHERE (kind = 'interrupt'::text);

-- VIEW shardq.events (execution_id uuid, seq bigint, position integer, kind text, name text, payload jsonb, recorded_at timestamp with time zone)

-- FUNCTION shardq.admission_lock_key()
--   RETURNS bigint
--   LANGUAGE sql IMMUTABLE
-- FUNCTION shardq.admit_task()
--   RETURNS trigger
--   LANGUAGE plpgsql VOLATILE
-- FUNCTION shardq.bucket(id uuid)
--   RETURNS integer
--   LANGUAGE sql IMMUTABLE
-- FUNCTION shardq.cancel_run(p_id uuid, p_actor text)
--   RETURNS boolean
--   LANGUAGE plpgsql VOLATILE
-- FUNCTION shardq.child_docs(p_docs jsonb)
--   RETURNS TABLE(id uuid, parent uuid, pos integer, tenant text, workflow text, version integer, workflow_id text, input jsonb, priority smallint, gates text[], trace text, o bigint)
--   LANGUAGE sql IMMUTABLE
-- FUNCTION shardq.child_outcomes(p_ids uuid[])
--   RETURNS TABLE(child uuid, parent uuid, tenant text, body jsonb, key text)
--   LANGUAGE sql STABLE
-- FUNCTION shardq.claim_fair(after_tenant text, want integer, claimable bit, OUT runs uuid[], OUT cursor_at text, OUT rest integer)
--   RETURNS record
--   LANGUAGE plpgsql VOLATILE SET plan_cache_mode=force_generic_plan, enable_bitmapscan=off
-- FUNCTION shardq.claim_outbox(p_limit integer)
--   RETURNS TABLE(id bigint, source_execution_id uuid, source_position integer, target_execution_id uuid, target_bucket smallint, tenant text, signal_name text, payload text, idempotency_key text, attempts integer, queued_s double precision, trace text)
--   LANGUAGE sql VOLATILE SET enable_nestloop=off, jit=off
-- FUNCTION shardq.claim_pinned(build text, min_priority smallint, want integer, claimable bit, taken uuid[])
--   RETURNS uuid[]
--   LANGUAGE plpgsql VOLATILE SET enable_seqscan=off, jit=off
-- FUNCTION shardq.claim_tasks(owner text, lim integer, lease_s double precision, min_priority smallint, after_tenant text, build text DEFAULT NULL::text)
--   RETURNS TABLE(execution_id uuid, lease_token uuid, claims integer, tenant text, workflow_name text, workflow_version integer, workflow_id text, input text, cancel_requested boolean, db_now timestamp with time zone, history text, signals text, next_due_in double precision, trace text)
--   LANGUAGE plpgsql VOLATILE SET enable_seqscan=off, jit=off
-- FUNCTION shardq.commit_turns_v2(lease_s double precision, c_ids uuid[], c_tokens uuid[], c_next uuid[], c_states text[], c_outputs jsonb[], c_errors jsonb[], c_actions text[], c_delays double precision[], c_close_wait boolean[], e_ids uuid[], e_positions integer[], e_kinds text[], e_names text[], e_payloads jsonb[], e_wake_ins double precision[], w_ids uuid[], w_positions integer[], w_kinds text[], w_names text[], w_deadline_ins double precision[], w_requests jsonb[], s_ids bigint[], s_positions integer[], p_ids uuid[], p_names text[], rare jsonb, c_steps jsonb[])
--   RETURNS TABLE(commit_ord integer, cancel_requested boolean, externals jsonb)
--   LANGUAGE plpgsql VOLATILE SET plan_cache_mode=force_generic_plan
-- FUNCTION shardq.count_changes()
--   RETURNS trigger
--   LANGUAGE plpgsql VOLATILE
-- FUNCTION shardq.decide_interrupt(p_tenant text, p_id uuid, p_name text, p_position integer, p_action text, p_payload jsonb, p_decision_id text, p_actor text)
--   RETURNS TABLE(outcome text, decision jsonb, detail text)
--   LANGUAGE plpgsql VOLATILE
-- FUNCTION shardq.declare_limits(p_keys text[], p_buckets integer[], p_limits integer[], p_probes uuid[])
--   RETURNS void
--   LANGUAGE plpgsql VOLATILE
-- FUNCTION shardq.defer_premature_timeouts(p_fenced uuid[], e_ids uuid[], e_positions integer[], e_kinds text[], s_ids bigint[])
--   RETURNS uuid[]
--   LANGUAGE plpgsql VOLATILE
-- FUNCTION shardq.deliver_control(p_tenant text, p_ids uuid[], p_names text[], p_payloads jsonb[], p_keys text[], p_origins text[], p_max_pending integer, p_max_pending_total integer)
--   RETURNS TABLE(ord integer, signal_id bigint, earlier_id bigint, earlier_name text, reason_code text, detail text, woken bigint)
--   LANGUAGE plpgsql VOLATILE
-- FUNCTION shardq.deliver_outcomes(p_tenant text, p_ids uuid[], p_payloads jsonb[], p_keys text[], p_origins text[])
--   RETURNS TABLE(ord integer, signal_id bigint, earlier_id bigint, reason_code text, detail text, woken bigint)
--   LANGUAGE plpgsql VOLATILE SET plan_cache_mode=force_generic_plan
-- FUNCTION shardq.deliver_signals(p_tenant text, p_ids uuid[], p_names text[], p_payloads jsonb[], p_keys text[], p_max_pending integer, p_max_pending_total integer, p_origins text[], p_traces text[] DEFAULT NULL::text[])
--   RETURNS TABLE(ord integer, signal_id bigint, earlier_id bigint, earlier_name text, reason_code text, detail text, woken bigint)
--   LANGUAGE plpgsql VOLATILE SET plan_cache_mode=force_generic_plan
-- FUNCTION shardq.fence(ids uuid[])
--   RETURNS boolean
--   LANGUAGE plpgsql VOLATILE
-- FUNCTION shardq.fill_slots(p_keys text[])
--   RETURNS integer
--   LANGUAGE plpgsql VOLATILE
-- FUNCTION shardq.finish_tasks(ids uuid[], tokens uuid[])
--   RETURNS TABLE(execution_id uuid, cancel_requested boolean, concurrency_key text)
--   LANGUAGE plpgsql VOLATILE SET plan_cache_mode=force_generic_plan, enable_seqscan=off, enable_bitmapscan=off
-- FUNCTION shardq.first_unset_bucket(ids uuid[], mask bit)
--   RETURNS integer
--   LANGUAGE plpgsql IMMUTABLE
-- FUNCTION shardq.fold_run_counts()
--   RETURNS bigint
--   LANGUAGE plpgsql VOLATILE
-- FUNCTION shardq.holds_exactly(mine bit)
--   RETURNS boolean
--   LANGUAGE plpgsql STABLE
-- FUNCTION shardq.lock_runs(p_tasks uuid[], p_runs uuid[])
--   RETURNS void
--   LANGUAGE plpgsql VOLATILE SET plan_cache_mode=force_generic_plan, enable_seqscan=off, jit=off
-- FUNCTION shardq.outbox_channel()
--   RETURNS text
--   LANGUAGE sql IMMUTABLE
-- FUNCTION shardq.owns(ids uuid[])
--   RETURNS boolean
--   LANGUAGE plpgsql STABLE
-- FUNCTION shardq.pinned_due(build text, claimable bit)
--   RETURNS timestamp with time zone
--   LANGUAGE sql STABLE
-- FUNCTION shardq.purgeable_runs(p_retention_s double precision, p_workflows text[], p_listed boolean, p_limit integer)
--   RETURNS TABLE(execution_id uuid)
--   LANGUAGE sql STABLE
-- FUNCTION shardq.release_slots(p_keys text[])
--   RETURNS integer
--   LANGUAGE plpgsql VOLATILE
-- FUNCTION shardq.run_state(run uuid)
--   RETURNS text
--   LANGUAGE plpgsql STABLE
-- FUNCTION shardq.runs_ended(p_ids uuid[])
--   RETURNS void
--   LANGUAGE plpgsql VOLATILE SET enable_seqscan=off, jit=off
-- FUNCTION shardq.send_control(p_source uuid, p_position integer, p_target uuid, p_tenant text, p_name text, p_payload jsonb, p_key text, p_here boolean)
--   RETURNS boolean
--   LANGUAGE plpgsql VOLATILE
-- FUNCTION shardq.set_concurrency_limit(p_key text, p_override integer, p_probe uuid)
--   RETURNS TABLE(key text, declared integer, override integer, running bigint, waiting bigint)
--   LANGUAGE plpgsql VOLATILE
-- FUNCTION shardq.signal_refusal(p_target uuid, p_tenant text, p_name text, p_max_pending integer, p_max_pending_total integer, p_run_tenant text, p_finished text, p_earlier_id bigint, p_gate_closed boolean, p_pending bigint, p_pending_total bigint)
--   RETURNS TABLE(reason_code text, detail text)
--   LANGUAGE sql STABLE
-- FUNCTION shardq.signal_with_start_v2(p_tenant text, p_workflow_name text, p_workflow_version integer, p_workflow_id text, p_new_id uuid, p_input jsonb, p_name text, p_payload jsonb, p_key text, p_max_pending integer, p_max_pending_total integer, p_gates text[], p_priority smallint, p_concurrency_key text, p_concurrency_limit integer)
--   RETURNS TABLE(execution_id uuid, created boolean, signal_id bigint, earlier_id bigint, earlier_name text, reason_code text, detail text)
--   LANGUAGE plpgsql VOLATILE
-- FUNCTION shardq.stale_waits(p_timer_s double precision, p_signal_s double precision, p_condition_s double precision, p_interrupt_s double precision, p_grace_s double precision)
--   RETURNS TABLE(execution_id uuid, kind text, name text, started_at timestamp with time zone, deadline timestamp with time zone)
--   LANGUAGE sql STABLE
-- FUNCTION shardq.start_child_runs(p_docs jsonb)
--   RETURNS void
--   LANGUAGE plpgsql VOLATILE
-- FUNCTION shardq.take_rate_slot(p_limiter text, p_run uuid, p_position integer, p_attempt integer, p_park_after double precision)
--   RETURNS double precision
--   LANGUAGE plpgsql VOLATILE
-- FUNCTION shardq.tasks_before(t timestamp with time zone)
--   RETURNS SETOF shardq.tasks
--   LANGUAGE sql STABLE
-- FUNCTION shardq.unclean_writable()
--   RETURNS bit
--   LANGUAGE plpgsql STABLE
-- FUNCTION shardq.wait_state(kind text)
--   RETURNS text
--   LANGUAGE sql IMMUTABLE
-- FUNCTION shardq.wake_channel()
--   RETURNS text
--   LANGUAGE sql IMMUTABLE
-- FUNCTION shardq.wake_note(priority integer)
--   RETURNS text
--   LANGUAGE sql IMMUTABLE
