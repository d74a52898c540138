-- The channel outbox relays LISTEN on: a turn commit that wrote outbox rows
-- notifies it once, a hint that rows are due (the relay's poll stays the
-- correctness path). Apart from the workers' wake channel, so relays are not
-- woken by every task made due and workers not by every outbox row. Per schema,
-- as wake_channel is.
CREATE OR REPLACE FUNCTION shardq.outbox_channel() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT replace('shardq.outbox', '.', '_') $$;
