-- Nothing calls these and no file defines them: commit_turns (one jsonb
-- batch), signal_with_start (no gates) and deliver_signals without origins.
DROP FUNCTION IF EXISTS shardq.commit_turns(float8, jsonb);
DROP FUNCTION IF EXISTS shardq.signal_with_start(
    text, text, integer, text, uuid, jsonb, text, jsonb, text, integer, integer);
DROP FUNCTION IF EXISTS shardq.deliver_signals(
    text, uuid[], text[], jsonb[], text[], integer, integer);

-- deliver_signals and signal_with_start_v2 answer a refusal's reason_code and
-- detail (schema/functions/signal_refusal.sql) in place of the fields their
-- callers derived one from; a function's answer cannot change in place, so
-- they are dropped here and their files create them again.
DROP FUNCTION IF EXISTS shardq.deliver_signals(
    text, uuid[], text[], jsonb[], text[], integer, integer, text[]);
DROP FUNCTION IF EXISTS shardq.signal_with_start_v2(
    text, text, integer, text, uuid, jsonb, text, jsonb, text, integer, integer, text[]);
