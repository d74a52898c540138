-- The payload of a wake NOTIFY: 'urgent' when the run it makes due has a
-- priority (docs/flow-control.md: a worker claims such runs at once, from the
-- levels above 0 only, instead of waiting for a full batch of free turn slots),
-- else ''. Identical payloads collapse into one NOTIFY per transaction, so a
-- batch sends at most one of each. IMMUTABLE: folded when the argument is a
-- constant of the calling statement.
CREATE OR REPLACE FUNCTION shardq.wake_note(priority integer) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN priority > 0 THEN 'urgent' ELSE '' END
$$;
