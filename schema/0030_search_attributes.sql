-- Search attributes (issue 40, docs/operations.md "Search attributes"): the typed
-- values a run sets about itself (ctx.set_attributes), written by the commit of
-- the turn that set them (commit_turns_v2, the `attributes` of its rare writes)
-- and kept until the run is purged; moves carry them with the run.
--
-- A value is kept once, as the JSON the workflow set (a string, number or
-- boolean; a time as its UTC ISO 8601 text), and indexed where its order is
-- the value's: strings and booleans as text, numbers as double precision, each
-- index led by the run's tenant and the attribute's name, so that one value's
-- runs are one range in id order (a page reads about a page of entries) and a
-- range of values is one range of the index.
CREATE TABLE shardq.run_attributes (
    execution_id uuid NOT NULL,
    name         text NOT NULL,
    tenant       text NOT NULL,
    value        jsonb NOT NULL,
    text_value   text GENERATED ALWAYS AS (
        CASE WHEN jsonb_typeof(value) IN ('string', 'boolean') THEN value #>> '{}' END) STORED,
    num_value    float8 GENERATED ALWAYS AS (
        CASE WHEN jsonb_typeof(value) = 'number' THEN (value #>> '{}')::float8 END) STORED,
    PRIMARY KEY (execution_id, name)
);
CREATE INDEX run_attributes_text ON shardq.run_attributes (tenant, name, text_value, execution_id)
    WHERE text_value IS NOT NULL;
CREATE INDEX run_attributes_num ON shardq.run_attributes (tenant, name, num_value, execution_id)
    WHERE num_value IS NOT NULL;
