-- Send one message between a parent and its child (schema/0023): delivered
-- here, in the caller's transaction, when `p_here` and the receiver's bucket
-- is writable on this shard; else queued in the outbox for the relay, which
-- finds the receiver's owner. Either way at most once per (source, position):
-- a message sent again (a retried start, a cancel asked twice) is dropped by
-- the outbox's unique source, the receiver's idempotency key, or the
-- receiver's own state. Returns whether it went to the outbox (the caller
-- wakes the relays once).
--
-- Source positions: a start goes at its call's position, a child's outcome at
-- -1 (a run ends once), a parent's cancel of the child started at position p
-- at -2 - p: none collides with a call's own.
CREATE OR REPLACE FUNCTION shardq.send_control(
    p_source uuid, p_position integer, p_target uuid, p_tenant text, p_name text,
    p_payload jsonb, p_key text, p_here boolean)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    own_writable bit(4096);
BEGIN
    IF p_here THEN
        SELECT o.writable INTO own_writable FROM shardq.ownership o;
        IF own_writable IS NULL OR get_bit(own_writable, shardq.bucket(p_target)) = 1 THEN
            -- Refused only for a receiver that is gone (its outcome was purged):
            -- nothing to tell it.
            PERFORM shardq.deliver_signals(p_tenant, ARRAY[p_target], ARRAY[p_name],
                                           ARRAY[p_payload], ARRAY[p_key], 1, 1,
                                           NULL::text[]);
            RETURN false;
        END IF;
    END IF;
    INSERT INTO shardq.outbox (source_execution_id, source_position, target_execution_id,
                               target_bucket, tenant, signal_name, payload, idempotency_key)
    VALUES (p_source, p_position, p_target, shardq.bucket(p_target)::smallint, p_tenant,
            p_name, p_payload, p_key)
    ON CONFLICT (source_execution_id, source_position) DO NOTHING;
    RETURN FOUND;
END
$$;
