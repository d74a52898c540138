-- The state a run's open wait puts it in, unless a worker holds it (run_state):
-- asking for input at an interrupt, waiting at any other wait.
CREATE OR REPLACE FUNCTION shardq.wait_state(kind text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT CASE WHEN kind = 'interrupt' THEN 'input_required' ELSE 'waiting' END $$;
