-- Task rows whose run_at is before `t`, pinned or not (schema/0026), each
-- kind read from the range of its own index: unpinned rows from tasks_due,
-- pinned ones from tasks_pinned build by build (a loose scan finds the builds,
-- one descent each). For the exporter's reads of due and overdue work, which
-- count every task row whatever build may claim it.
CREATE OR REPLACE FUNCTION shardq.tasks_before(t timestamptz)
RETURNS SETOF shardq.tasks
LANGUAGE sql STABLE
AS $$
    WITH RECURSIVE builds(build_id) AS (
        (SELECT p.build_id FROM shardq.tasks p WHERE p.build_id IS NOT NULL
         ORDER BY p.build_id LIMIT 1)
        UNION ALL
        SELECT (SELECT p.build_id FROM shardq.tasks p WHERE p.build_id > b.build_id
                ORDER BY p.build_id LIMIT 1)
        FROM builds b WHERE b.build_id IS NOT NULL
    )
    SELECT u.* FROM shardq.tasks u WHERE u.build_id IS NULL AND u.run_at < t
    UNION ALL
    SELECT p.* FROM builds b
    CROSS JOIN LATERAL (SELECT * FROM shardq.tasks x
                        WHERE x.build_id = b.build_id AND x.run_at < t) p
$$;
